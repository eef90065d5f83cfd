//! Owns the one wasmtime [`Engine`] of a host process: its configuration
//! (trimmed features, epoch interruption) and the choice between the
//! pooling and the on-demand instance allocator, sized from what the
//! process can map. It leaves the epoch ticker that drives interruption to
//! `ticker`, the settings to `config`, what runs in a store to `attempt`
//! and what gets compiled to `plugin`.

#![forbid(unsafe_code)]

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How many guest instances the pooling allocator holds slots for by default.
pub const DEFAULT_POOL_INSTANCES: u32 = 1000;

/// Address space one pooled linear memory reserves (4 GiB of addressable
/// memory plus wasmtime's default 32 MiB guard region), used to size the pool
/// from the process's address-space limit.
const RESERVATION_PER_MEMORY: u64 = (4 << 30) + (32 << 20);
/// Memories per pooled instance slot: CPython- and JS-based components carry
/// more than one core instance, but rarely more than one or two memories.
const MEMORIES_PER_INSTANCE: u32 = 2;
/// Address space of one instance slot besides its memories: the async fiber
/// stack (2 MiB and a guard page) and four tables of 40,000 elements.
const RESERVATION_PER_INSTANCE_BESIDES_MEMORIES: u64 = (2 << 20) + (4 << 10) + 4 * 40_000 * 8;
/// The user address space assumed when `/proc/self/maps` cannot tell
/// (x86-64 with 4-level page tables: 47 bits).
const DEFAULT_USER_ADDRESS_SPACE: u64 = 1 << 47;
/// Fewer pooled instances than this is not worth the pool; use on-demand.
const MIN_POOL_INSTANCES: u32 = 16;

/// How the engine allocates guest instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorChoice {
    /// Pooling when the address-space reservation succeeds, else on-demand.
    Auto,
    /// Always the pooling allocator; fail if it cannot reserve its pool.
    Pooling,
    /// Always allocate on demand (slower, no up-front reservation).
    OnDemand,
}

/// Which allocator the engine ended up with, for `host inspect` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// The pooling allocator with this many instance slots.
    Pooling {
        /// Instance slots in the pool.
        instances: u32,
        /// How a slot's memory is reset for its next instance.
        reset: PoolReset,
    },
    /// The on-demand allocator.
    OnDemand {
        /// How many instances this process can map at once (from
        /// `vm.max_map_count` and the address space).
        capacity: u32,
    },
}

/// How the pooling allocator resets a slot's linear memory between two
/// instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolReset {
    /// Only the pages the last instance dirtied, found with the
    /// `PAGEMAP_SCAN` ioctl (Linux 6.7+): no page faults on reuse.
    PagemapScan,
    /// Kept-resident bytes with `memset`, the rest decommitted. Used when
    /// the ioctl is missing, or when swap or zswap is on: wasmtime 48.0.8's
    /// scan looks only at present pages, so a dirty page that was swapped
    /// out would be neither reset nor decommitted, and the next instance in
    /// that slot could read the last task's memory.
    Memset {
        /// Why not the scan.
        why: &'static str,
    },
}

/// Whether pages of this process can be swapped out now: an active swap
/// area (a line of `/proc/swaps` past its header) or zswap enabled. Read
/// once, when the engine is built; swap turned on later needs a restart.
fn swap_active() -> bool {
    let swaps = std::fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().skip(1).any(|l| !l.trim().is_empty()))
        .unwrap_or(false);
    let zswap = std::fs::read_to_string("/sys/module/zswap/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y");
    swaps || zswap
}

/// Pool slots kept free of attempts (see [`Allocator::attempt_capacity`]) for
/// the `describe` calls of plugins loaded while every permit is in use.
pub const POOL_RESERVE: u32 = 8;

impl Allocator {
    /// How many attempts may hold an instance at once without exhausting
    /// the pool or what the process can map: the pool's slots, or the
    /// instances the on-demand allocator can map, less [`POOL_RESERVE`]
    /// (at least 1).
    pub fn attempt_capacity(&self) -> Option<usize> {
        let (Self::Pooling { instances, .. }
        | Self::OnDemand {
            capacity: instances,
        }) = self;
        Some(instances.saturating_sub(POOL_RESERVE).max(1) as usize)
    }

    /// What bounds [`Allocator::attempt_capacity`], and how to raise it.
    pub fn capacity_reason(&self) -> &'static str {
        match self {
            Self::Pooling { .. } => {
                "the instance pool's slots (raise --pool-instances; the pool is cut to what \
                 the address space, ulimit -v and vm.max_map_count allow)"
            }
            Self::OnDemand { .. } => {
                "the instances this process can map (raise vm.max_map_count or ulimit -v)"
            }
        }
    }
}

/// Builds the engine with the allocator `choice` and a pool of at most
/// `pool_instances` slots (the settings
/// [`RuntimeConfig::allocator`](crate::RuntimeConfig::allocator) and
/// [`RuntimeConfig::pool_instances`](crate::RuntimeConfig::pool_instances)),
/// trying the pooling allocator first when asked to; the error says what
/// went wrong and what to change.
pub(crate) fn build_engine(
    choice: AllocatorChoice,
    pool_instances: u32,
) -> Result<(Engine, Allocator), String> {
    let mut base = Config::new();
    base.epoch_interruption(true);
    base.wasm_component_model(true);
    // Guests get 1 MiB of wasm stack; async host calls run on fibers with a
    // little more room for host frames.
    base.max_wasm_stack(1 << 20);
    base.async_stack_size(2 << 20);

    let room = Room::of_this_process();
    let slots = match choice {
        AllocatorChoice::OnDemand => None,
        AllocatorChoice::Pooling | AllocatorChoice::Auto => pool_size(pool_instances, room),
    };
    if slots.is_none() && choice == AllocatorChoice::Pooling {
        return Err(
            "the address-space limit (ulimit -v) is too small for the pooling allocator; \
             raise it or use the on-demand allocator"
                .into(),
        );
    }
    if let Some(instances) = slots {
        let reset = if !PoolingAllocationConfig::is_pagemap_scan_available() {
            PoolReset::Memset {
                why: "this kernel has no PAGEMAP_SCAN",
            }
        } else if swap_active() {
            PoolReset::Memset {
                why: "swap or zswap is on",
            }
        } else {
            PoolReset::PagemapScan
        };
        // The reservation can fail for want of one contiguous range of
        // address space: try smaller pools before giving up on pooling.
        let mut tried = instances;
        let failure = loop {
            let mut pooled = base.clone();
            pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling_config(
                tried, reset,
            )));
            match Engine::new(&pooled) {
                Ok(engine) => {
                    if tried < instances {
                        tracing::info!(
                            "the instance pool could not reserve {instances} slots; it has {tried}"
                        );
                    }
                    let allocator = Allocator::Pooling {
                        instances: tried,
                        reset,
                    };
                    return Ok((engine, allocator));
                }
                Err(err) => {
                    let smaller = tried / 16 * 15;
                    if smaller < MIN_POOL_INSTANCES {
                        break err;
                    }
                    tried = smaller;
                }
            }
        };
        if choice == AllocatorChoice::Pooling {
            return Err(format!(
                "the pooling allocator could not reserve {instances} instance slots, nor \
                 fewer: {failure}; lower the pool size or use the on-demand allocator"
            ));
        }
        tracing::info!("pooling allocator unavailable, allocating on demand: {failure}");
    }
    let engine = Engine::new(&base).map_err(|e| e.to_string())?;
    Ok((
        engine,
        Allocator::OnDemand {
            capacity: on_demand_capacity(room),
        },
    ))
}

/// The address space one pooled instance slot reserves (nothing of it is
/// resident until used).
const fn reservation_per_instance() -> u64 {
    RESERVATION_PER_MEMORY * MEMORIES_PER_INSTANCE as u64
        + RESERVATION_PER_INSTANCE_BESIDES_MEMORIES
}

/// What this process can map: its address-space limit (`ulimit -v`), the
/// size of the user address space, and the kernel's cap on mappings per
/// process (`vm.max_map_count`).
#[derive(Debug, Clone, Copy)]
struct Room {
    limit: Option<u64>,
    user_space: u64,
    max_map_count: u64,
}

impl Room {
    fn of_this_process() -> Self {
        Self {
            limit: address_space_limit(),
            user_space: user_address_space(),
            max_map_count: max_map_count(),
        }
    }

    /// Address space instances may take: half of `ulimit -v`, if any (the
    /// process's own heap counts against it too), and three quarters of the
    /// user address space.
    fn address_budget(&self) -> u64 {
        (self.user_space / 4 * 3).min(self.limit.map_or(u64::MAX, |l| l / 2))
    }

    /// Instances whose mappings fit `vm.max_map_count`, past what the rest
    /// of the process maps, at `per_instance` mappings each.
    fn by_maps(&self, per_instance: u64) -> u64 {
        self.max_map_count.saturating_sub(MAPS_RESERVED) / per_instance
    }
}

/// Mappings the process keeps for everything but guest instances (its
/// binary, libraries, threads' stacks, heap arenas, compiled plugins).
const MAPS_RESERVED: u64 = 4096;
/// Mappings one live pooled instance adds: its memory's accessible part
/// split off the pool's reservation, and a copy-on-write image.
const MAPS_PER_POOLED_INSTANCE: u64 = 5;
/// Mappings one live instance allocated on demand adds: its memory's
/// reservation and accessible part, its image, its fiber stack and guard
/// page, and its tables (the 9,355th `sleeper` failed at the default cap).
const MAPS_PER_ON_DEMAND_INSTANCE: u64 = 8;
/// Linux's default `vm.max_map_count`, assumed when it cannot be read.
const DEFAULT_MAX_MAP_COUNT: u64 = 65_530;

/// The kernel's cap on mappings per process.
fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_MAP_COUNT)
}

/// Sizes the pool: `wanted` slots, cut to what the address-space budget
/// ([`Room::address_budget`]: about 12,000 slots of 8 GiB on x86-64) and
/// `vm.max_map_count` allow; `None` when that leaves too few slots to be
/// worth it (the caller then allocates on demand).
fn pool_size(wanted: u32, room: Room) -> Option<u32> {
    let fit = (room.address_budget() / reservation_per_instance())
        .min(room.by_maps(MAPS_PER_POOLED_INSTANCE))
        .min(u64::from(wanted)) as u32;
    // A pool too small to be worth its reservation (or none at all): the
    // on-demand allocator, as documented.
    (fit >= MIN_POOL_INSTANCES).then_some(fit)
}

/// How many instances the on-demand allocator can hold at once: each
/// reserves its memories' address space as a pooled slot does, and maps
/// as many regions.
fn on_demand_capacity(room: Room) -> u32 {
    (room.address_budget() / reservation_per_instance())
        .min(room.by_maps(MAPS_PER_ON_DEMAND_INSTANCE))
        .min(u64::from(u32::MAX)) as u32
}

fn pooling_config(instances: u32, reset: PoolReset) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::new();
    // Limits sized for guests from other languages too: a CPython-based
    // component has 14 core instances, a 12 MiB initial memory and a table of
    // about 6k elements; a JavaScript one about 8k table elements.
    pool.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(4))
        .total_memories(instances.saturating_mul(MEMORIES_PER_INSTANCE))
        .total_tables(instances.saturating_mul(4))
        .total_stacks(instances)
        .max_core_instances_per_component(64)
        .max_memories_per_component(16)
        .max_tables_per_component(64)
        .max_memories_per_module(1)
        .max_tables_per_module(8)
        .table_elements(40_000)
        .max_memory_size(4 << 30)
        .max_core_instance_size(4 << 20)
        .max_component_instance_size(4 << 20)
        .pagemap_scan(match reset {
            PoolReset::PagemapScan => Enabled::Yes,
            PoolReset::Memset { .. } => Enabled::No,
        });
    if reset == PoolReset::PagemapScan {
        // Reuse a slot without page faults: keep what an attempt dirtied
        // resident and reset only those pages (found with the PAGEMAP_SCAN
        // ioctl, Linux 6.7+): instantiation then faults no pages in.
        pool.linear_memory_keep_resident(2 << 20)
            .table_keep_resident(64 << 10);
    } else {
        // Without the ioctl, keep-resident bytes are reset with memset on
        // every reuse: keep that small.
        pool.linear_memory_keep_resident(64 << 10)
            .table_keep_resident(16 << 10);
    }
    pool
}

/// The size of the user address space: the top of the main thread's stack
/// (the highest user mapping but the vsyscall page) rounded up to a power of
/// two, from `/proc/self/maps`.
fn user_address_space() -> u64 {
    let top = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            let line = maps.lines().find(|l| l.ends_with("[stack]"))?;
            let end = line.split_whitespace().next()?.split('-').nth(1)?;
            u64::from_str_radix(end, 16).ok()
        });
    top.and_then(u64::checked_next_power_of_two)
        .unwrap_or(DEFAULT_USER_ADDRESS_SPACE)
}

/// Reads the soft `RLIMIT_AS` of this process from `/proc/self/limits`.
fn address_space_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft = line.split_whitespace().nth(3)?;
    soft.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(limit: Option<u64>, user_space: u64, max_map_count: u64) -> Room {
        Room {
            limit,
            user_space,
            max_map_count,
        }
    }

    #[test]
    fn pool_is_sized_from_the_address_space_limit() {
        const VA: u64 = 1 << 47;
        let maps = 1 << 20;
        assert_eq!(pool_size(1000, room(None, VA, maps)), Some(1000));
        assert_eq!(
            pool_size(8, room(None, VA, maps)),
            None,
            "below the minimum: on-demand"
        );
        assert_eq!(pool_size(0, room(None, VA, maps)), None);
        // 1 TiB limit: half of it fits 63 slots of two 4 GiB memories.
        assert_eq!(pool_size(1000, room(Some(1 << 40), VA, maps)), Some(63));
        // 8 GiB (a typical `ulimit -v`) is too small for a useful pool.
        assert_eq!(pool_size(1000, room(Some(8 << 30), VA, maps)), None);
        // Without a limit, three quarters of 128 TiB: room for 10,000
        // parked tasks, not for 100,000.
        assert_eq!(pool_size(10_016, room(None, VA, maps)), Some(10_016));
        let most = pool_size(100_000, room(None, VA, maps)).unwrap();
        assert!((12_000..12_300).contains(&most), "{most}");
        // A 39-bit address space (some arm64 kernels): 47 slots.
        assert_eq!(pool_size(1000, room(None, 1 << 39, maps)), Some(47));
    }

    #[test]
    fn instances_are_capped_by_the_mappings_the_kernel_allows() {
        const VA: u64 = 1 << 47;
        // Linux's default: 65,530 mappings.
        let default = room(None, VA, DEFAULT_MAX_MAP_COUNT);
        let pooled = pool_size(20_000, default).unwrap();
        assert!(pooled >= 10_016, "10,000 parked tasks still fit: {pooled}");
        let lower = pool_size(20_000, room(None, VA, 40_000)).unwrap();
        assert_eq!(
            u64::from(lower),
            (40_000 - MAPS_RESERVED) / MAPS_PER_POOLED_INSTANCE
        );
        let on_demand = on_demand_capacity(default);
        assert_eq!(
            u64::from(on_demand),
            (DEFAULT_MAX_MAP_COUNT - MAPS_RESERVED) / MAPS_PER_ON_DEMAND_INSTANCE
        );
        assert!(
            on_demand < 9_355,
            "on demand, the 9,355th instance failed: {on_demand}"
        );
        // A tiny cap: no pool; on demand, at least what the budget allows.
        assert_eq!(pool_size(1000, room(None, VA, 4096)), None);
        assert_eq!(on_demand_capacity(room(None, VA, 4096)), 0);
        assert_eq!(on_demand_capacity(room(Some(200 << 30), VA, 1 << 20)), 12);
    }

    #[test]
    fn the_user_address_space_is_read_from_this_process() {
        let va = user_address_space();
        assert!(va.is_power_of_two() && va >= 1 << 39, "{va:#x}");
    }
}
