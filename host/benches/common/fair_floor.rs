//! The fair floor of a plugin attempt (issue 56, target 1): what any
//! embedder pays to run this same `hello` with wasmtime itself, on the
//! runtime's engine: the component pre-linked with wasmtime-wasi's WASI 0.2
//! imports (of its `taskhost:plugin` imports, `log` drops its line and the
//! others, which `hello` never calls, trap), a store with the smallest WASI
//! context, an instance,
//! the typed call of `run`, and the store dropped. No limits, no capture,
//! no supervisor: the cost of running the component, and nothing of ours.

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "task-plugin",
        exports: { default: async },
    });
}

/// The store's data: the smallest WASI context and its table.
pub struct Host {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Defines `host.log` as a function that drops the line (`hello` logs
/// one), each other function of the component's `taskhost:` imports as a
/// trap and each of their resources as a host resource. (wasmtime's own
/// `define_unknown_imports_as_traps` stubs `wasi:io@0.2.12` too, which
/// the linker holds under its own 0.2 version, and the types then differ.)
fn traps_for_taskhost_imports(linker: &mut Linker<Host>, component: &Component, engine: &Engine) {
    use wasmtime::component::ResourceType;
    use wasmtime::component::types::ComponentItem;
    for (name, item) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        if !name.starts_with("taskhost:") {
            continue;
        }
        let mut linked = linker.instance(name).expect("a new instance");
        for (export, item) in instance.exports(engine) {
            match item.ty {
                // `hello` logs a line: the cheapest embedder drops it.
                ComponentItem::ComponentFunc(_)
                    if export == "log" && name.starts_with("taskhost:plugin/host@") =>
                {
                    type Level = bindings::taskhost::plugin::types::Level;
                    linked
                        .func_wrap("log", |_, (_level, _line): (Level, String)| Ok(()))
                        .expect("log");
                }
                ComponentItem::ComponentFunc(_) => {
                    let trap = format!("{name}#{export}");
                    linked
                        .func_new(export, move |_, _, _, _| {
                            wasmtime::bail!("`{trap}` is not linked in the floor")
                        })
                        .expect("a trap");
                }
                ComponentItem::Resource(_) => linked
                    .resource(export, ResourceType::host::<()>(), |_, _| Ok(()))
                    .expect("a resource"),
                _ => {}
            }
        }
    }
}

/// `hello`, pre-linked on an engine.
pub struct FairFloor {
    engine: Engine,
    pre: bindings::TaskPluginPre<Host>,
}

impl FairFloor {
    /// Compiles `wasm` on `engine` and links it as any embedder would.
    pub fn new(engine: &Engine, wasm: &[u8]) -> Self {
        let component = Component::new(engine, wasm).expect("the plugin compiles");
        let mut linker = Linker::<Host>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).expect("WASI links");
        traps_for_taskhost_imports(&mut linker, &component, engine);
        let pre = linker
            .instantiate_pre(&component)
            .expect("the plugin links");
        Self {
            engine: engine.clone(),
            pre: bindings::TaskPluginPre::new(pre).expect("the plugin exports `run`"),
        }
    }

    /// One attempt: a store, the instance, `run(input)`, and the drop.
    pub async fn once(&self, input: &[u8]) -> Vec<u8> {
        let host = Host {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
        };
        let mut store = Store::new(&self.engine, host);
        // The engine interrupts by epoch, as for our attempts.
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);
        let plugin = self
            .pre
            .instantiate_async(&mut store)
            .await
            .expect("instantiate");
        plugin
            .call_run(&mut store, input)
            .await
            .expect("run")
            .unwrap_or_else(|_| panic!("the plugin failed"))
    }
}
