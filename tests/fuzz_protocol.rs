//! Fuzzing of the daemon's wire protocol with proptest: the frame decoder
//! and request decoding on arbitrary bytes and on mutated valid frames (no
//! panic; a length prefix over `MAX_FRAME` is `TooLarge` and allocates
//! nothing; decoding allocates in proportion to its input, plus serde's
//! capped 1 MiB of pre-allocation), the round trip of arbitrary valid
//! requests, and a live daemon that keeps serving a normal client while
//! hostile connections send garbage, truncated and oversized frames.
//!
//! Short by default. `TASKHOST_FUZZ_CASES=N` sets the cases per run of each
//! property (default 256, daemon 48); `TASKHOST_FUZZ_SECS=S` repeats the runs
//! of each property for S seconds (see TESTING.md). A failing case's seed is
//! saved to `tests/corpus/fuzz_protocol.proptest-regressions` and replayed
//! first on every later run; `tests/corpus/frames/` holds seed frames that
//! `corpus_frames_decode_as_named` and the daemon test replay
//! (`TASKHOST_WRITE_CORPUS=1` rewrites them).

#[path = "e2e/common/mod.rs"]
mod common;
#[path = "e2e/common/daemon.rs"]
mod daemon;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::protocol::{
    DeploymentVerb, Envelope, EventFilter, FrameError, Hello, KvTarget, KvVerb, MAGIC, MAX_FRAME,
    NotBefore, PROTOCOL_VERSION, Reply, Request, ScheduleSpec, ScheduleVerb, SubmitRequest,
    TaskFilter, TaskPage, TaskState, Welcome, decode, encode, read_frame,
};
use taskhost::daemon::schedule::Missed;
use taskhost::outcome::OutcomeKind;
use taskhost::runtime::{Digest, DirGrant};
use taskhost::supervisor::{BackoffPolicy, EventKind, Jitter, RestartPolicy, TaskId, TaskRef};

// ---------------------------------------------------------------------------
// Allocation accounting: the peak of live bytes allocated by this thread.

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().wrapping_add(delta);
        live.set(now);
        let _ = PEAK.try_with(|peak| {
            if now > peak.get() {
                peak.set(now);
            }
        });
    });
}

// SAFETY: every call forwards to the system allocator with the same
// arguments; the bookkeeping touches only const-initialised thread-locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the peak of bytes it had allocated
/// at once on this thread.
fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get) - start;
    (out, peak.max(0) as usize)
}

/// What decoding `n` bytes may allocate at most: serde pre-allocates at
/// most 1 MiB for a sequence whatever its length prefix says, everything
/// else grows with the bytes actually there.
fn decode_budget(n: usize) -> usize {
    (2 << 20) + 64 * n
}

// ---------------------------------------------------------------------------
// Runner: a fixed number of cases, or runs repeated for a time budget.

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/corpus/fuzz_protocol.proptest-regressions"
);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `test` on values of `strategy`: `cases` cases (TASKHOST_FUZZ_CASES
/// overrides), repeated with fresh seeds until TASKHOST_FUZZ_SECS seconds
/// have passed when that is set. Prints the executions and the time.
fn fuzz<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let cases = env_u64("TASKHOST_FUZZ_CASES").map_or(default_cases, |c| c as u32);
    let budget = env_u64("TASKHOST_FUZZ_SECS").map(Duration::from_secs);
    let executions = AtomicU64::new(0);
    let started = Instant::now();
    loop {
        let mut config = Config::with_cases(cases);
        config.failure_persistence = Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS)));
        config.max_shrink_iters = 4096;
        let mut runner = TestRunner::new(config);
        let result = runner.run(&strategy, |value| {
            executions.fetch_add(1, Ordering::Relaxed);
            test(value)
        });
        if let Err(err) = result {
            panic!("{name}: {err}");
        }
        if budget.is_none_or(|b| started.elapsed() >= b) {
            break;
        }
    }
    eprintln!(
        "fuzz {name}: {} executions in {:.1}s",
        executions.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// Strategies.

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9/_.{}=-]{0,16}",
        1 => any::<String>(),
    ]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..max)
}

fn target() -> impl Strategy<Value = TaskRef> {
    prop_oneof![
        any::<u64>().prop_map(|id| TaskRef::Id(TaskId::from_u64(id))),
        text().prop_map(TaskRef::Name)
    ]
}

fn digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 32]>().prop_map(Digest)
}

fn duration() -> impl Strategy<Value = Duration> {
    (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n))
}

fn policy() -> impl Strategy<Value = AdmissionPolicy> {
    prop_oneof![
        Just(AdmissionPolicy::Queue),
        Just(AdmissionPolicy::Replace),
        Just(AdmissionPolicy::DropIfRunning),
    ]
}

fn restart() -> impl Strategy<Value = RestartPolicy> {
    prop_oneof![
        Just(RestartPolicy::Never),
        Just(RestartPolicy::OnFailure),
        duration().prop_map(|interval| RestartPolicy::Always { interval }),
    ]
}

fn backoff() -> impl Strategy<Value = BackoffPolicy> {
    let jitter = prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
    ];
    (0u64..100_000, 0u64..100_000, 1.0f64..1e6, jitter).prop_filter_map(
        "a valid backoff",
        |(first, max, factor, jitter)| {
            BackoffPolicy::new(
                Duration::from_millis(first),
                Duration::from_millis(max),
                factor,
                jitter,
            )
            .ok()
        },
    )
}

fn pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    vec((text(), text()), 0..4)
}

fn submit() -> impl Strategy<Value = SubmitRequest> {
    let head = (
        digest(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(policy()),
        pairs(),
        bytes(256),
        proptest::option::of(restart()),
    );
    let tail = (
        proptest::option::of(any::<u32>()),
        proptest::option::of(backoff()),
        proptest::option::of(duration()),
        proptest::option::of(any::<u64>()),
        vec(
            (text(), text(), any::<bool>()).prop_map(|(host, guest, read_only)| DirGrant {
                host: host.into(),
                guest,
                read_only,
            }),
            0..3,
        ),
        pairs(),
    );
    (head, tail).prop_map(
        |(
            (digest, name, slot, policy, params, input, restart),
            (max_retries, backoff, timeout, max_memory, dirs, env),
        )| {
            let mut s = SubmitRequest::new(digest);
            s.name = name;
            s.slot = slot;
            s.policy = policy;
            s.params = params;
            s.input = input;
            s.restart = restart;
            s.max_retries = max_retries;
            s.backoff = backoff;
            s.timeout = timeout;
            s.max_memory = max_memory;
            s.dirs = dirs;
            s.env = env;
            s
        },
    )
}

fn filter() -> impl Strategy<Value = EventFilter> {
    let kind = prop_oneof![
        Just(EventKind::TaskAdded),
        Just(EventKind::TaskFinished),
        Just(EventKind::GuestLog),
    ];
    (proptest::option::of(target()), vec(kind, 0..3))
        .prop_map(|(task, kinds)| EventFilter { task, kinds })
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        digest().prop_map(Request::HasPlugin),
        (digest(), any::<u64>(), bytes(512), any::<bool>()).prop_map(
            |(digest, offset, data, last)| Request::Upload {
                digest,
                offset,
                data,
                last
            }
        ),
        submit().prop_map(|s| Request::Submit(Box::new(s))),
        target().prop_map(Request::Wait),
        (target(), any::<bool>()).prop_map(|(target, wait)| Request::Cancel { target, wait }),
        any::<bool>().prop_map(|all| Request::List { all }),
        Just(Request::Slots),
        (any::<bool>(), filter()).prop_map(|(follow, filter)| Request::Events { follow, filter }),
        (target(), any::<bool>()).prop_map(|(target, follow)| Request::Logs { target, follow }),
        (proptest::option::of(duration()), any::<bool>())
            .prop_map(|(grace, cancel_all)| Request::Shutdown { grace, cancel_all }),
        Just(Request::Plugins),
        proptest::option::of("[0-9a-f]{0,64}").prop_map(|prefix| Request::RemovePlugins { prefix }),
    ]
}

fn envelope() -> impl Strategy<Value = Envelope<Request>> {
    (any::<u32>(), request()).prop_map(|(id, body)| Envelope { id, body })
}

/// How a valid frame is damaged.
#[derive(Debug, Clone)]
enum Mutation {
    /// Set byte `at` (modulo the length) to `value`.
    Set(usize, u8),
    /// Flip bit `bit` of byte `at`.
    Flip(usize, u8),
    /// Cut the frame to `len` bytes (modulo its length).
    Truncate(usize),
    /// Insert bytes at `at`.
    Insert(usize, Vec<u8>),
    /// Remove `n` bytes at `at`.
    Remove(usize, usize),
    /// Replace the length prefix.
    Prefix(u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(a, v)| Mutation::Set(a, v)),
        (any::<usize>(), 0u8..8).prop_map(|(a, b)| Mutation::Flip(a, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), bytes(16)).prop_map(|(a, b)| Mutation::Insert(a, b)),
        (any::<usize>(), 1usize..8).prop_map(|(a, n)| Mutation::Remove(a, n)),
        any::<u32>().prop_map(Mutation::Prefix),
    ]
}

fn mutate(mut frame: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = frame.len().max(1);
        match m {
            Mutation::Set(at, v) if !frame.is_empty() => frame[at % len] = *v,
            Mutation::Flip(at, bit) if !frame.is_empty() => frame[at % len] ^= 1 << bit,
            Mutation::Truncate(n) => frame.truncate(n % len),
            Mutation::Insert(at, b) => {
                let at = at % (frame.len() + 1);
                frame.splice(at..at, b.iter().copied());
            }
            Mutation::Remove(at, n) if !frame.is_empty() => {
                let at = at % len;
                let end = (at + n).min(frame.len());
                frame.drain(at..end);
            }
            Mutation::Prefix(p) if frame.len() >= 4 => frame[..4].copy_from_slice(&p.to_be_bytes()),
            _ => {}
        }
    }
    frame
}

fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (envelope(), vec(mutation(), 1..4)).prop_map(|(e, ms)| mutate(encode(&e).unwrap(), &ms))
}

/// Reads one frame from `bytes`, as the daemon reads a connection.
fn read_one<T: for<'de> serde::Deserialize<'de>>(bytes: &[u8]) -> Result<T, FrameError> {
    futures::executor::block_on(read_frame(&mut &bytes[..]))
}

/// Checks what decoding a frame did: no panic (we got here), bounded
/// allocation, and a valid result survives a round trip.
fn check_frame(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (result, peak) = peak_alloc(|| read_one::<Envelope<Request>>(bytes));
    prop_assert!(
        peak <= decode_budget(bytes.len()) + (64 << 10),
        "reading a frame of {} bytes allocated {peak} bytes at once",
        bytes.len()
    );
    if bytes.len() >= 4 {
        let prefix = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as u64;
        if prefix > MAX_FRAME as u64 {
            prop_assert!(
                matches!(result, Err(FrameError::TooLarge(n)) if n == prefix),
                "a prefix of {prefix} is TooLarge, got {result:?}"
            );
            prop_assert!(peak < 4096, "TooLarge allocated {peak} bytes");
        }
    }
    if let Ok(envelope) = result {
        let again = encode(&envelope).unwrap();
        let back: Envelope<Request> = read_one(&again).unwrap();
        prop_assert_eq!(back, envelope);
    }
    // The same bytes as any other message type the protocol decodes.
    let _ = read_one::<Hello>(bytes);
    let _ = read_one::<Welcome>(bytes);
    let _ = read_one::<Envelope<Reply>>(bytes);
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoder properties.

#[test]
fn arbitrary_bytes_never_panic_and_allocate_in_proportion() {
    fuzz("arbitrary bytes", 512, bytes(2048), |body| {
        // As a frame body ...
        let (result, peak) = peak_alloc(|| decode::<Envelope<Request>>(&body));
        prop_assert!(peak <= decode_budget(body.len()), "decode allocated {peak}");
        if let Ok(e) = result {
            prop_assert_eq!(
                decode::<Envelope<Request>>(&encode(&e).unwrap()[4..]).unwrap(),
                e
            );
        }
        let _ = decode::<Hello>(&body);
        let _ = decode::<Envelope<Reply>>(&body);
        // ... and as a stream of frames.
        check_frame(&body)
    });
}

#[test]
fn mutated_valid_frames_never_panic() {
    fuzz("mutated frames", 512, mutated_frame(), |frame| {
        check_frame(&frame)
    });
}

#[test]
fn length_prefixes_over_the_limit_are_rejected_without_allocating() {
    let prefix = (MAX_FRAME as u32 + 1)..=u32::MAX;
    fuzz(
        "oversized prefixes",
        256,
        (prefix, bytes(64)),
        |(len, tail)| {
            let mut frame = len.to_be_bytes().to_vec();
            frame.extend(tail);
            let (result, peak) = peak_alloc(|| read_one::<Envelope<Request>>(&frame));
            prop_assert!(
                matches!(result, Err(FrameError::TooLarge(n)) if n == u64::from(len)),
                "{result:?}"
            );
            prop_assert!(peak < 4096, "a rejected prefix allocated {peak} bytes");
            Ok(())
        },
    );
}

#[test]
fn valid_requests_round_trip() {
    fuzz("round trip", 256, envelope(), |e| {
        let frame = encode(&e).unwrap();
        prop_assert!(frame.len() <= MAX_FRAME + 4);
        let back: Envelope<Request> = read_one(&frame).unwrap();
        prop_assert_eq!(&back, &e);
        // Cut anywhere, it is an error, never a panic or a wrong value.
        for cut in [0, 1, 3, 4, frame.len() / 2, frame.len() - 1] {
            let result = read_one::<Envelope<Request>>(&frame[..cut]);
            prop_assert!(result.is_err(), "a frame cut at {cut} decoded: {result:?}");
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// The seed corpus.

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/frames")
}

fn frame(body: Request) -> Vec<u8> {
    encode(&Envelope { id: 7, body }).unwrap()
}

/// The seed frames: valid frames of every request kind, and frames that are
/// cut short, oversized or malformed, named by what reading them gives.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut submit = SubmitRequest::new(Digest([0xab; 32]));
    submit.name = Some("nap".into());
    submit.slot = Some("deploy/prod".into());
    submit.policy = Some(AdmissionPolicy::Replace);
    submit.params = vec![("env".into(), "prod".into()), ("ms".into(), "50".into())];
    submit.input = b"hello".to_vec();
    submit.restart = Some(RestartPolicy::OnFailure);
    submit.max_retries = Some(3);
    submit.backoff = Some("100ms,5s,2,equal".parse().unwrap());
    submit.timeout = Some(Duration::from_secs(30));
    submit.max_memory = Some(64 << 20);
    submit.dirs = vec![DirGrant {
        host: "/tmp".into(),
        guest: "/data".into(),
        read_only: true,
    }];
    submit.env = vec![("TOKEN".into(), "x".into())];
    submit.secrets = vec![taskhost::runtime::SecretRef {
        var: "API_KEY".into(),
        name: "api-key".into(),
    }];
    submit.config = vec![("region".into(), "eu".into())];
    submit.kv = vec!["counters".into()];
    let mut command = SubmitRequest::new(Digest([0xcd; 32]));
    command.args = vec!["--minimize".into(), "-".into(), String::new()];
    command.input = b"{\"a\": 1}".to_vec();
    let mut by_name = SubmitRequest::new(Digest([0; 32]));
    by_name.deployment = Some("resize@1.4.0".into());
    let valid = vec![
        ("has-plugin", Request::HasPlugin(Digest([1; 32]))),
        (
            "upload",
            Request::Upload {
                digest: Digest([2; 32]),
                offset: 0,
                data: b"\0asm\x0d\0\x01\0".to_vec(),
                last: true,
            },
        ),
        ("submit", Request::Submit(Box::new(submit))),
        ("submit-command", Request::Submit(Box::new(command))),
        ("submit-deployment", Request::Submit(Box::new(by_name))),
        (
            "deploy",
            Request::Deployment(DeploymentVerb::Deploy {
                digest: Digest([0xef; 32]),
                name: Some("resize".into()),
                version: Some("1.4.0".into()),
            }),
        ),
        (
            "rollback",
            Request::Deployment(DeploymentVerb::Rollback {
                name: "resize".into(),
                to: None,
            }),
        ),
        (
            "download",
            Request::Download {
                digest: Digest([0xef; 32]),
                offset: 1 << 20,
            },
        ),
        ("wait-id", Request::Wait(TaskRef::Id(TaskId::from_u64(42)))),
        ("wait-name", Request::Wait(TaskRef::Name("deploy-1".into()))),
        (
            "cancel",
            Request::Cancel {
                target: TaskRef::Id(TaskId::from_u64(9)),
                wait: true,
            },
        ),
        ("list", Request::List { all: true }),
        ("slots", Request::Slots),
        (
            "events-follow",
            Request::Events {
                follow: true,
                filter: EventFilter::default(),
            },
        ),
        (
            "logs-follow",
            Request::Logs {
                target: TaskRef::Name("x".into()),
                follow: true,
            },
        ),
        (
            "shutdown",
            Request::Shutdown {
                grace: Some(Duration::from_millis(250)),
                cancel_all: true,
            },
        ),
        ("plugins", Request::Plugins),
        (
            "remove-plugins",
            Request::RemovePlugins {
                prefix: Some("3f9a".into()),
            },
        ),
        ("prune-plugins", Request::RemovePlugins { prefix: None }),
        ("kv-list", Request::Kv(KvVerb::List(None))),
        (
            "kv-get",
            Request::Kv(KvVerb::Get(
                KvTarget::Slot("deploy/prod".into()),
                "runs".into(),
            )),
        ),
        (
            "kv-rm",
            Request::Kv(KvVerb::Remove(
                KvTarget::Shared("counters".into()),
                "hits".into(),
            )),
        ),
        (
            "submit-delayed",
            Request::Submit(Box::new({
                let mut later = SubmitRequest::new(Digest([0xcd; 32]));
                later.not_before = Some(NotBefore::At(1_800_000_000_000));
                later.priority = -2;
                later
            })),
        ),
        (
            "cancel-matching",
            Request::CancelMatching {
                filter: TaskFilter {
                    state: Some(TaskState::Queued),
                    slot: Some("deploy-*".into()),
                    name: None,
                    plugin: Some("sleeper".into()),
                    outcome: None,
                    since_ms: Some(1_796_000_000_000),
                    until_ms: Some(1_796_000_600_000),
                },
                dry_run: true,
            },
        ),
        (
            "page",
            Request::Page(TaskPage {
                all: true,
                filter: TaskFilter {
                    outcome: Some(OutcomeKind::Failed),
                    ..TaskFilter::default()
                },
                before: Some(TaskId::from_u64(1_234)),
                limit: Some(20),
            }),
        ),
        (
            "rerun-matching",
            Request::RerunMatching {
                filter: TaskFilter {
                    outcome: Some(OutcomeKind::Failed),
                    ..TaskFilter::default()
                },
                dry_run: false,
            },
        ),
        (
            "submit-batch",
            Request::SubmitBatch(vec![
                SubmitRequest::new(Digest([0xab; 32])),
                SubmitRequest::new(Digest([0xcd; 32])),
            ]),
        ),
        (
            "schedule-add",
            Request::Schedule(ScheduleVerb::Add(Box::new(ScheduleSpec {
                name: "nightly".into(),
                cron: "30 2 * * *".into(),
                tz: Some("Europe/Berlin".into()),
                missed: Missed::Skip,
                request: SubmitRequest::new(Digest([0xef; 32])),
            }))),
        ),
        ("schedule-list", Request::Schedule(ScheduleVerb::List)),
        (
            "schedule-run",
            Request::Schedule(ScheduleVerb::Run("nightly".into())),
        ),
    ];
    let mut out: Vec<(String, Vec<u8>)> = valid
        .into_iter()
        .map(|(name, body)| (format!("ok-{name}.bin"), frame(body)))
        .collect();
    let hello = encode(&Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
    })
    .unwrap();
    out.push(("hello-ok.bin".into(), hello));
    let submit = out[2].1.clone();
    out.push((
        "cut-submit-half.bin".into(),
        submit[..submit.len() / 2].to_vec(),
    ));
    out.push(("cut-body-missing.bin".into(), vec![0, 0, 0, 100, 1, 2, 3]));
    out.push(("closed-partial-prefix.bin".into(), vec![0, 0]));
    out.push(("closed-empty.bin".into(), Vec::new()));
    out.push((
        "too-large-max.bin".into(),
        vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3],
    ));
    let mut over = (MAX_FRAME as u32 + 1).to_be_bytes().to_vec();
    over.extend_from_slice(b"more");
    out.push(("too-large-just-over.bin".into(), over));
    // An Upload whose data claims 4 GiB but holds four bytes.
    let mut lying = vec![7, 1];
    lying.extend_from_slice(&[2; 32]);
    lying.extend_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3, 4]);
    let mut framed = (lying.len() as u32).to_be_bytes().to_vec();
    framed.extend(lying);
    out.push(("malformed-lying-length.bin".into(), framed));
    out.push(("malformed-variant.bin".into(), vec![0, 0, 0, 2, 7, 200]));
    out.push(("malformed-empty-body.bin".into(), vec![0, 0, 0, 0]));
    out.push((
        "malformed-bad-utf8.bin".into(),
        vec![0, 0, 0, 6, 7, 3, 1, 3, 0xff, 0xfe],
    ));
    out.push((
        "malformed-garbage.bin".into(),
        b"\0\0\0\x10GET / HTTP/1.1\r\n".to_vec(),
    ));
    out
}

fn read_corpus() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus/frames exists")
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .filter(|(name, _)| name.ends_with(".bin"))
        .collect();
    files.sort();
    files
}

#[test]
fn corpus_frames_decode_as_named() {
    if std::env::var_os("TASKHOST_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(corpus_dir()).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(corpus_dir().join(name), bytes).unwrap();
        }
    }
    // The accounting itself sees allocations.
    let (_, peak) = peak_alloc(|| std::hint::black_box(vec![1u8; 10_000]));
    assert!(peak >= 10_000, "the allocation counter works: {peak}");
    let files = read_corpus();
    assert!(
        files.len() >= seeds().len(),
        "the corpus is there: {}",
        files.len()
    );
    for (name, bytes) in &files {
        check_frame(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let result = read_one::<Envelope<Request>>(bytes);
        let expected = match name.split('-').next().unwrap() {
            "ok" => result.is_ok(),
            "hello" => read_one::<Hello>(bytes).is_ok(),
            "cut" => matches!(result, Err(FrameError::Io(_))),
            "closed" => matches!(result, Err(FrameError::Closed)),
            "too" => matches!(result, Err(FrameError::TooLarge(_))),
            "malformed" => matches!(result, Err(FrameError::Malformed(_))),
            other => panic!("{name}: unknown corpus prefix {other}"),
        };
        assert!(
            expected,
            "{name}: read as {result:?} (if the protocol changed on purpose, rewrite the corpus with TASKHOST_WRITE_CORPUS=1)"
        );
    }
}

// ---------------------------------------------------------------------------
// A live daemon under hostile connections.

/// What a hostile connection sends.
#[derive(Debug, Clone)]
enum Hostile {
    /// Bytes instead of a hello.
    Raw(Vec<u8>),
    /// A proper hello, then bytes.
    AfterHello(Vec<u8>),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let junk = prop_oneof![
        bytes(256),
        vec(mutated_frame(), 1..4).prop_map(|f| f.concat()),
        (envelope(), 0usize..64).prop_map(|(e, cut)| {
            let f = encode(&e).unwrap();
            f[..cut.min(f.len().saturating_sub(1))].to_vec()
        }),
        ((MAX_FRAME as u32 + 1)..=u32::MAX, bytes(32)).prop_map(|(len, tail)| {
            let mut f = len.to_be_bytes().to_vec();
            f.extend(tail);
            f
        }),
    ];
    (any::<bool>(), junk).prop_map(|(hello, junk)| {
        if hello {
            Hostile::AfterHello(junk)
        } else {
            Hostile::Raw(junk)
        }
    })
}

/// Whether any frame the daemon would read from `bytes` is a valid Shutdown
/// request (which the daemon would rightly obey).
fn would_shut_down(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        if len > MAX_FRAME || rest.len() < 4 + len {
            return false;
        }
        match decode::<Envelope<Request>>(&rest[4..4 + len]) {
            Ok(Envelope {
                body: Request::Shutdown { .. },
                ..
            }) => return true,
            Ok(_) => rest = &rest[4 + len..],
            Err(_) => return false,
        }
    }
    false
}

fn hello_frame() -> Vec<u8> {
    encode(&Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
    })
    .unwrap()
}

fn read_frame_sync(stream: &mut UnixStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).expect("a frame's length");
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).expect("a frame's body");
    body
}

fn handshake(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.set_read_timeout(Some(daemon::LIMIT)).unwrap();
    stream.write_all(&hello_frame()).unwrap();
    let _: Welcome = decode(&read_frame_sync(&mut stream)).expect("a welcome");
    stream
}

/// One List round trip (pages of tasks, then the end) on a normal client's
/// connection.
fn assert_normal_client_served(stream: &mut UnixStream, id: u32) {
    stream
        .write_all(
            &encode(&Envelope {
                id,
                body: Request::List { all: true },
            })
            .unwrap(),
        )
        .expect("the normal client can still write");
    loop {
        let reply: Envelope<Reply> = decode(&read_frame_sync(stream)).expect("a reply");
        assert_eq!(reply.id, id);
        match reply.body {
            Reply::Tasks(_) => continue,
            Reply::End => return,
            other => panic!("List answers pages of tasks, then End: {other:?}"),
        }
    }
}

/// Sends one hostile connection's bytes, then leaves.
fn send_hostile(socket: &Path, hostile: &Hostile) {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let bytes = match hostile {
        Hostile::Raw(bytes) => bytes,
        Hostile::AfterHello(bytes) => {
            stream.write_all(&hello_frame()).unwrap();
            let _ = read_frame_sync(&mut stream);
            bytes
        }
    };
    // The daemon may close first (EPIPE): that is its right.
    let _ = stream.write_all(bytes);
}

#[test]
fn a_live_daemon_keeps_serving_while_connections_send_garbage() {
    let mut d = daemon::Daemon::start(&[]);
    let socket = d.socket.clone();
    let mut normal = handshake(&socket);
    assert_normal_client_served(&mut normal, 1);

    // The seed corpus, before and after a hello (never a valid shutdown).
    for (name, bytes) in read_corpus() {
        if would_shut_down(&bytes) {
            continue;
        }
        send_hostile(&socket, &Hostile::Raw(bytes.clone()));
        send_hostile(&socket, &Hostile::AfterHello(bytes));
        assert_normal_client_served(&mut normal, 2);
        let _ = name;
    }

    let normal = std::sync::Mutex::new(normal);
    let cases = std::sync::atomic::AtomicU32::new(0);
    let default_cases = env_u64("TASKHOST_FUZZ_CASES").map_or(48, |c| (c / 4).max(1) as u32);
    let strategy = hostile().prop_filter("not a valid shutdown", |h| match h {
        Hostile::Raw(_) => true,
        Hostile::AfterHello(bytes) => !would_shut_down(bytes),
    });
    fuzz("daemon connections", default_cases, strategy, |hostile| {
        send_hostile(&socket, &hostile);
        let n = cases.fetch_add(1, Ordering::Relaxed);
        let mut normal = normal.lock().unwrap();
        assert_normal_client_served(&mut normal, n);
        if n.is_multiple_of(16) {
            // New connections are still accepted.
            let mut fresh = handshake(&socket);
            assert_normal_client_served(&mut fresh, n);
        }
        Ok(())
    });
    d.assert_served("after-the-fuzz");
}
