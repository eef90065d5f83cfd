;; `two-memories`: a bad plugin for the memory-limit tests, written by hand
;; as a component in the text format, because a Rust guest has one linear
;; memory. It has two core instances with a memory of 64 KiB each and
;; exports `describe` and `run` of taskhost:plugin@0.1.0 (it imports
;; nothing). `run` grows its own memory to 20 MiB, then the other instance's
;; memory to 20 MiB, 40 MiB in all, and returns `both memories grew to
;; 20MiB`, or fails with `two-memories: the first (second) memory could not
;; grow to 20MiB`: a limit of 32 MiB on all memories together stops the
;; second growth, where one per memory would not. Assembled by the tests
;; with the `wat` crate.
(component
  ;; The second memory, and a function that grows it.
  (core module $other
    (memory (export "memory") 1)
    (func (export "grow") (param i32) (result i32)
      (memory.grow (local.get 0))))
  (core instance $o (instantiate $other))

  (core module $m
    (import "other" "grow" (func $grow_other (param i32) (result i32)))
    (memory (export "memory") 1)
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

    (data (i32.const 16) "two-memories")
    (data (i32.const 32) "0.1.0")
    (data (i32.const 48) "Grows each of its two memories to 20MiB (a hand-written component)")
    (data (i32.const 128) "both memories grew to 20MiB")
    (data (i32.const 160) "two-memories: the first memory could not grow to 20MiB")
    (data (i32.const 640) "two-memories: the second memory could not grow to 20MiB")

    ;; plugin-info at 256: name, version, description (ptr, len each),
    ;; resource none, default-policy queue, no capabilities.
    (func (export "describe") (result i32)
      (i32.store (i32.const 256) (i32.const 16))
      (i32.store (i32.const 260) (i32.const 12))
      (i32.store (i32.const 264) (i32.const 32))
      (i32.store (i32.const 268) (i32.const 5))
      (i32.store (i32.const 272) (i32.const 48))
      (i32.store (i32.const 276) (i32.const 66))
      (i32.store8 (i32.const 280) (i32.const 0))
      (i32.store8 (i32.const 292) (i32.const 0))
      (i32.store (i32.const 296) (i32.const 0))
      (i32.store (i32.const 300) (i32.const 0))
      (i32.const 256))

    ;; result::err(task-error::fail(failure { reason, exit-code: none })) at
    ;; 512, the reason at (ptr, len).
    (func $fail (param i32 i32) (result i32)
      (i32.store8 (i32.const 512) (i32.const 1))
      (i32.store8 (i32.const 516) (i32.const 0))
      (i32.store (i32.const 520) (local.get 0))
      (i32.store (i32.const 524) (local.get 1))
      (i32.store8 (i32.const 528) (i32.const 0))
      (i32.const 512))

    ;; run: each memory from 1 page to 320 (20 MiB), own first, then
    ;; result::ok(the message) at 512.
    (func (export "run") (param i32 i32) (result i32)
      (if (i32.eq (memory.grow (i32.const 319)) (i32.const -1))
        (then (return (call $fail (i32.const 160) (i32.const 54)))))
      (if (i32.eq (call $grow_other (i32.const 319)) (i32.const -1))
        (then (return (call $fail (i32.const 640) (i32.const 55)))))
      (i32.store8 (i32.const 512) (i32.const 0))
      (i32.store (i32.const 516) (i32.const 128))
      (i32.store (i32.const 520) (i32.const 27))
      (i32.const 512))
  )
  (core instance $i (instantiate $m (with "other" (instance $o))))

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
