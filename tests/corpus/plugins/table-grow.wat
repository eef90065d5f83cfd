;; `table-grow`: a bad plugin for the exhaustion tests, written by hand as a
;; component in the text format, because stable Rust cannot emit `table.grow`.
;; It exports `describe` and `run` of taskhost:plugin@0.1.0 (and imports
;; nothing). `run` grows a funcref table 1024 elements at a time until
;; `table.grow` fails (the host's table limit), then returns
;; `fail("table-grow: table.grow failed")`. Assembled by the tests with the `wat` crate.
(component
  (core module $m
    (memory (export "memory") 2)
    (table $t 1 funcref)
    (global $bump (mut i32) (i32.const 4096))

    ;; cabi_realloc(old_ptr, old_size, align, new_size): a bump allocator.
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p
        (i32.and
          (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
          (i32.sub (i32.const 0) (local.get 2))))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (block $ok
        (br_if $ok
          (i32.le_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536))))
        (br_if $ok
          (i32.ne
            (memory.grow
              (i32.add
                (i32.shr_u
                  (i32.sub (global.get $bump) (i32.mul (memory.size) (i32.const 65536)))
                  (i32.const 16))
                (i32.const 1)))
            (i32.const -1)))
        unreachable)
      (local.get $p))

    (data (i32.const 16) "table-grow")
    (data (i32.const 32) "0.1.0")
    (data (i32.const 48) "Grows a table until table.grow fails (a hand-written component)")
    (data (i32.const 128) "table-grow: table.grow failed")

    ;; plugin-info at 256: name, version, description (ptr, len each),
    ;; resource none, default-policy queue, no capabilities.
    (func (export "describe") (result i32)
      (i32.store (i32.const 256) (i32.const 16))
      (i32.store (i32.const 260) (i32.const 10))
      (i32.store (i32.const 264) (i32.const 32))
      (i32.store (i32.const 268) (i32.const 5))
      (i32.store (i32.const 272) (i32.const 48))
      (i32.store (i32.const 276) (i32.const 63))
      (i32.store8 (i32.const 280) (i32.const 0))
      (i32.store8 (i32.const 292) (i32.const 0))
      (i32.store (i32.const 296) (i32.const 0))
      (i32.store (i32.const 300) (i32.const 0))
      (i32.const 256))

    ;; run: grow until it fails, then result::err(task-error::fail(failure
    ;; { reason, exit-code: none })) at 512.
    (func (export "run") (param i32 i32) (result i32)
      (loop $grow
        (br_if $grow
          (i32.ne (table.grow $t (ref.null func) (i32.const 1024)) (i32.const -1))))
      (i32.store8 (i32.const 512) (i32.const 1))
      (i32.store8 (i32.const 516) (i32.const 0))
      (i32.store (i32.const 520) (i32.const 128))
      (i32.store (i32.const 524) (i32.const 29))
      (i32.store8 (i32.const 528) (i32.const 0))
      (i32.const 512))
  )
  (core instance $i (instantiate $m))

  (type $policy' (enum "queue" "replace" "drop-if-running"))
  (export $policy "policy" (type $policy'))
  (type $capability' (variant
    (case "read-dir" string)
    (case "write-dir" string)
    (case "env" string)
    (case "network")))
  (export $capability "capability" (type $capability'))
  (type $plugin-info' (record
    (field "name" string)
    (field "version" string)
    (field "description" string)
    (field "resource" (option string))
    (field "default-policy" $policy)
    (field "capabilities" (list $capability))))
  (export $plugin-info "plugin-info" (type $plugin-info'))
  (type $failure' (record (field "reason" string) (field "exit-code" (option s32))))
  (export $failure "failure" (type $failure'))
  (type $task-error' (variant
    (case "fail" $failure)
    (case "fatal" $failure)
    (case "canceled")))
  (export $task-error "task-error" (type $task-error'))

  (func (export "describe") (result $plugin-info)
    (canon lift (core func $i "describe") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "run") (param "input" (list u8)) (result (result (list u8) (error $task-error)))
    (canon lift (core func $i "run") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
)
