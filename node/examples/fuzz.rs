//! `cargo xtask fuzz [--cases N]`: every decoder and parser that takes bytes
//! from outside, fed N cases each (default 100,000), mutated from valid
//! inputs or random: a panic, a case that runs past [`CASE_TIME_MAX`], or
//! one that allocates past [`CASE_ALLOC_MAX`] beyond what was live before it
//! fails the run, with the input saved under `target/fuzz/`. One seed
//! (`--seed S`, default 1) replays a run.
//!
//! Targets: wire frames and messages (`Frame::parse`, `Message::decode`),
//! Raft messages and proposals into a live control plane, the Raft log and
//! the block-version checkpoint at replay, the cluster map's encoding, the
//! node's TOML config, RDMA's connection hello and messenger header, and NBD
//! sessions (handshake options, then transmission commands) against the real
//! server over loopback TCP with an in-memory backend. Not yet: TLS (weir has
//! none), the TCP transport's hello (crate-private; covered by its own tests).

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir_core::control::{ClusterState, ControlPlane, Timeouts};
use weir_core::wire::{Frame, Message};
use weir_core::{Epoch, Lba, NodeId, OpId, RequestId, VolumeId};
use weir_node::nbd::{self, Backend, Export};

/// A case may allocate at most this much beyond what was live before it.
const CASE_ALLOC_MAX: usize = 256 << 20;
/// A case that runs longer is a hang.
const CASE_TIME_MAX: Duration = Duration::from_secs(10);

/// Counts live and peak heap bytes, to catch unbounded allocation.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// When the running case started (ns since start, 0: none), for the watchdog.
static CASE_STARTED: AtomicU64 = AtomicU64::new(0);

/// One input changed: a few of bit flips, byte sets, insertions, deletions,
/// truncation, duplication, interesting integers; or random bytes.
fn mutate(rng: &mut SmallRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if seeds.is_empty() || rng.gen_ratio(1, 10) {
        let n = rng.gen_range(0..512);
        return (0..n).map(|_| rng.gen()).collect();
    }
    let mut b = seeds[rng.gen_range(0..seeds.len())].clone();
    for _ in 0..rng.gen_range(1..=4) {
        let len = b.len();
        match rng.gen_range(0..7) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                b[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                b[i] = rng.gen();
            }
            2 => {
                let i = rng.gen_range(0..=len);
                let n = rng.gen_range(1..32);
                let ins: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                b.splice(i..i, ins);
            }
            3 if len > 0 => {
                let i = rng.gen_range(0..len);
                let j = rng.gen_range(i..=len.min(i + 64));
                b.drain(i..j);
            }
            4 => b.truncate(rng.gen_range(0..=len)),
            5 if len > 0 => {
                let i = rng.gen_range(0..len);
                let j = rng.gen_range(i..=len);
                let chunk = b[i..j].to_vec();
                b.extend_from_slice(&chunk);
            }
            _ if len >= 4 => {
                let i = rng.gen_range(0..=len - 4);
                let v: u32 = [0, 1, 0x7fff_ffff, 0xffff_ffff, 0x8000_0000, len as u32 + 1]
                    [rng.gen_range(0..6)];
                let v = if rng.gen() {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                b[i..i + 4].copy_from_slice(&v);
            }
            _ => {}
        }
    }
    b
}

/// The code under test, given one input.
type Case = Box<dyn FnMut(&[u8])>;

/// A target: its name, valid inputs to start from, and the code under test.
struct Target {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    run: Case,
}

fn frames() -> Target {
    let msgs = [
        Message::fetched(OpId(7), Ok(Bytes::from(vec![0xab; 4096]))),
        Message::Read {
            req: RequestId(1),
            volume: VolumeId(1),
            epoch: Epoch(3),
            lba: Lba(64),
            blocks: 8,
            delta: 1,
        },
        Message::Write {
            req: RequestId(2),
            volume: VolumeId(1),
            epoch: Epoch(3),
            lba: Lba(0),
            data: Bytes::from(vec![1; 8192]),
            fua: true,
            delta: 1,
        },
    ];
    let seeds = msgs
        .iter()
        .map(|m| {
            let f = m.encode().expect("encodes");
            [&f.head[..], &f.payload[..]].concat()
        })
        .collect();
    Target {
        name: "wire frames and messages",
        seeds,
        run: Box::new(|b| {
            if let Ok(f) = Frame::parse(Bytes::copy_from_slice(b)) {
                let _ = Message::decode(f);
            }
            let _ = Message::decode_bytes(Bytes::copy_from_slice(b));
        }),
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        lease_ns: 1_500_000_000,
        detect_ns: 1_000_000_000,
        replace_ns: 0,
    }
}

fn members() -> Vec<NodeId> {
    vec![NodeId(1), NodeId(2), NodeId(3)]
}

fn raft_messages() -> Target {
    let mut plane = ControlPlane::new(NodeId(2), &members(), Vec::new(), timeouts(), 1)
        .expect("a control plane");
    Target {
        name: "Raft messages and proposals",
        seeds: Vec::new(),
        run: Box::new(move |b| {
            plane.handle_raft(NodeId(1), b);
            plane.handle_propose(NodeId(3), b);
        }),
    }
}

fn raft_log() -> Target {
    let seeds = vec![
        weir_core::record::frame(b"not a record"),
        [
            weir_core::record::frame(&[1, 2, 3, 4]),
            weir_core::record::frame(&[0; 40]),
        ]
        .concat(),
    ];
    Target {
        name: "Raft log replay",
        seeds,
        run: Box::new(|b| {
            let _ = ControlPlane::open(NodeId(1), &members(), Vec::new(), timeouts(), 1, b);
        }),
    }
}

fn checkpoints() -> Target {
    let seeds = vec![weir_core::record::frame(&[0; 64])];
    Target {
        name: "block-version checkpoint replay",
        seeds,
        run: Box::new(|b| {
            let _ = weir_core::replication::versions::replay(b, "dev", 1 << 20, 16);
        }),
    }
}

fn cluster_state() -> Target {
    Target {
        name: "cluster map encoding",
        seeds: vec![vec![0; 32]],
        run: Box::new(|b| {
            let _ = ClusterState::decode(b);
        }),
    }
}

fn config() -> Target {
    let text = "[node]\nid = 1\n\n[cluster]\nreplicas = 3\npool_size = \"8G\"\n\
                members = [\n  { id = 1, addr = \"127.0.0.1:7401\" },\n  \
                { id = 2, addr = \"127.0.0.1:7402\" },\n  { id = 3, addr = \"127.0.0.1:7403\" },\n]\n\n\
                [nbd]\nlisten = \"127.0.0.1:10809\"\n\n[device]\nqueues = 2\nmode = \"sqpoll\"\n\n\
                [transport]\nkind = \"rdma\"\n[rdma]\nports = [1, 2]\npool_bytes = \"256M\"\n";
    Target {
        name: "TOML config",
        seeds: vec![text.as_bytes().to_vec()],
        run: Box::new(|b| {
            let text = String::from_utf8_lossy(b);
            let _ = weir_node::config::Config::parse(&text, Path::new("weir.toml"));
        }),
    }
}

fn rdma() -> Target {
    use weir_transport_rdma::net::hello::{Hello, LEN};
    use weir_transport_rdma::proto::header::Header;
    let hello = Hello {
        cluster_id: 7,
        node: NodeId(2),
        path: 0,
        params: weir_transport_rdma::proto::Params::default(),
        endpoint: weir_transport_rdma::net::nic::Endpoint {
            qpn: 17,
            psn: 99,
            gid: [1; 16],
            mtu: 4096,
        },
        regions_addr: 1 << 40,
        regions_rkey: 5,
    };
    let header = Header {
        frame: true,
        credits: 3,
        grants: vec![0, 1, 2],
    };
    Target {
        name: "RDMA hello and messenger header",
        seeds: vec![hello.encode().to_vec(), header.encode().to_vec()],
        run: Box::new(|b| {
            let mut h = [0u8; LEN];
            let n = b.len().min(LEN);
            h[..n].copy_from_slice(&b[..n]);
            let _ = Hello::decode(&h, 7, 2);
            let _ = Header::decode(b);
        }),
    }
}

/// One export of 1 MiB, in memory.
struct MemBackend {
    data: Mutex<Vec<u8>>,
}

impl Backend for MemBackend {
    fn exports(&self) -> Vec<Export> {
        vec![
            Export {
                name: "v".into(),
                size: 1 << 20,
                key: None,
                locked: None,
                read_only: false,
                id: None,
            },
            // One that refuses to open, so option sequences reach that reply.
            Export {
                name: "sealed".into(),
                size: 1 << 20,
                key: None,
                locked: Some("locked".into()),
                read_only: false,
                id: None,
            },
        ]
    }
    async fn read(&self, _: &Export, offset: u64, len: u32) -> Result<Bytes, u32> {
        let d = self.data.lock().unwrap();
        Ok(Bytes::copy_from_slice(
            &d[offset as usize..offset as usize + len as usize],
        ))
    }
    async fn write(&self, _: &Export, offset: u64, data: Bytes, _: bool) -> Result<(), u32> {
        let mut d = self.data.lock().unwrap();
        d[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        Ok(())
    }
    async fn flush(&self, _: &Export) -> Result<(), u32> {
        Ok(())
    }
    async fn zero(&self, _: &Export, offset: u64, len: u32, _: bool) -> Result<(), u32> {
        let mut d = self.data.lock().unwrap();
        d[offset as usize..offset as usize + len as usize].fill(0);
        Ok(())
    }
}

/// A valid client session: newstyle flags, `NBD_OPT_GO` for "v", then a
/// write, a read, a flush, a trim and a disconnect.
fn nbd_session() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&3u32.to_be_bytes()); // fixed newstyle, no zeroes
    let name = b"v";
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name);
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&3u16.to_be_bytes()); // NBD_INFO_BLOCK_SIZE
    b.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    b.extend_from_slice(&7u32.to_be_bytes()); // NBD_OPT_GO
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(&data);
    let mut cmd = |kind: u16, offset: u64, len: u32, payload: bool| {
        b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&u64::from(kind).to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        if payload {
            b.extend(std::iter::repeat_n(0x5a, len as usize));
        }
    };
    cmd(1, 4096, 512, true); // write
    cmd(0, 4096, 512, false); // read
    cmd(3, 0, 0, false); // flush
    cmd(4, 0, 4096, false); // trim
    cmd(2, 0, 0, false); // disconnect
    b
}

/// The bytes a client sends up to and with `NBD_OPT_STARTTLS`: it then waits
/// for the server's answer before it starts TLS.
fn starttls_prefix() -> Vec<u8> {
    let mut b = 3u32.to_be_bytes().to_vec(); // fixed newstyle, no zeroes
    b.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    b.extend_from_slice(&5u32.to_be_bytes()); // NBD_OPT_STARTTLS
    b.extend_from_slice(&0u32.to_be_bytes());
    b
}

/// STARTTLS, then a TLS 1.3 ClientHello as rustls's client sends it.
fn nbd_tls_session() -> Vec<u8> {
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut client = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut b = starttls_prefix();
    client.write_tls(&mut b).unwrap();
    b
}

/// A front end that requires TLS, with a self-signed certificate.
fn nbd_tls() -> Target {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let tls = nbd::NbdTls::new(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        None,
        true,
    )
    .unwrap();
    nbd_with(
        "NBD over TLS (STARTTLS, TLS handshake)",
        tls,
        vec![nbd_tls_session(), nbd_session()],
    )
}

fn nbd() -> Target {
    nbd_with(
        "NBD sessions (handshake, then commands)",
        nbd::NbdTls::off(),
        vec![nbd_session()],
    )
}

/// NBD sessions against a front end with `tls`. An input that opens with
/// STARTTLS is sent as a client would: the rest only once the server answered.
fn nbd_with(name: &'static str, tls: nbd::NbdTls, seeds: Vec<Vec<u8>>) -> Target {
    let rt = tokio_real::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = Arc::new(MemBackend {
        data: Mutex::new(vec![0; 1 << 20]),
    });
    let listener = rt
        .block_on(tokio_real::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let prefix = starttls_prefix();
    Target {
        name,
        seeds,
        run: Box::new(move |b| {
            rt.block_on(async {
                use tokio_real::io::{AsyncReadExt, AsyncWriteExt};
                let client = tokio_real::net::TcpStream::connect(addr);
                let (accepted, client) = tokio_real::join!(listener.accept(), client);
                let (server_side, _) = accepted.unwrap();
                let (backend, tls) = (backend.clone(), tls.clone());
                let server =
                    tokio_real::spawn(async move { nbd::handle(server_side, backend, &tls).await });
                let mut c = client.unwrap();
                let mut rest = b;
                if b.starts_with(&prefix) {
                    // The greeting, then STARTTLS; its answer before the rest.
                    let _ = c.write_all(&prefix).await;
                    let mut answer = [0u8; 18 + 20];
                    let _ = tokio_real::time::timeout(
                        Duration::from_secs(5),
                        c.read_exact(&mut answer),
                    )
                    .await;
                    rest = &b[prefix.len()..];
                }
                let _ = c.write_all(rest).await;
                let _ = c.shutdown().await;
                let mut sink = [0u8; 4096];
                let drained = tokio_real::time::timeout(Duration::from_secs(5), async {
                    while let Ok(n) = c.read(&mut sink).await {
                        if n == 0 {
                            break;
                        }
                    }
                })
                .await;
                assert!(
                    drained.is_ok(),
                    "the server neither answered nor closed within 5 s"
                );
                match tokio_real::time::timeout(Duration::from_secs(5), server).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Ok(Err(_)) => {}
                    Err(_) => panic!("the server's task did not end within 5 s of EOF"),
                }
            })
        }),
    }
}

/// Run `t` for `cases` cases from `seed`; the failures, each reported and
/// its input saved under `out`.
fn run_target(t: &mut Target, cases: u64, seed: u64, out: &Path, start: Instant) -> u32 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let mut worst_alloc = 0usize;
    let mut failures = 0;
    for case in 0..cases {
        let input = mutate(&mut rng, &t.seeds);
        if case % 1000 == 0 {
            std::fs::write(out.join("last-input.bin"), &input).unwrap();
        }
        let live = LIVE.load(Ordering::Relaxed);
        PEAK.store(live, Ordering::Relaxed);
        CASE_STARTED.store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let run = &mut t.run;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&input)));
        CASE_STARTED.store(0, Ordering::Relaxed);
        let grew = PEAK.load(Ordering::Relaxed).saturating_sub(live);
        worst_alloc = worst_alloc.max(grew);
        let why = match result {
            Err(e) => Some(format!(
                "panic: {}",
                e.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            )),
            Ok(()) if grew > CASE_ALLOC_MAX => Some(format!("allocated {grew} bytes")),
            Ok(()) => None,
        };
        if let Some(why) = why {
            failures += 1;
            let file = out.join(format!("{}-{case}.bin", t.name.replace(' ', "_")));
            std::fs::write(&file, &input).unwrap();
            if failures <= 3 {
                println!(
                    "  {}: case {case}: {why} (input: {})",
                    t.name,
                    file.display()
                );
            }
        }
    }
    println!(
        "  {:<44} {cases} cases in {:>6.1} s, most allocated by one case {} KiB, {failures} failures",
        t.name,
        t0.elapsed().as_secs_f64(),
        worst_alloc >> 10
    );
    failures
}

/// The harness checked against targets that fail on purpose: a panic and an
/// allocation past the bound are each caught, and a hang ends the process
/// (run as a child, `--self-test-hang`).
fn self_test(out: &Path, start: Instant) {
    let mut panics = Target {
        name: "self-test panic",
        seeds: vec![vec![1, 2, 3]],
        run: Box::new(|b| assert!(b.len() % 7 != 3, "a planted panic")),
    };
    let mut hog = Target {
        name: "self-test allocation",
        seeds: vec![vec![1, 2, 3]],
        run: Box::new(|b| {
            if b.first() == Some(&0) {
                let v = vec![1u8; CASE_ALLOC_MAX + (1 << 20)];
                std::hint::black_box(&v);
            }
        }),
    };
    assert!(
        run_target(&mut panics, 2000, 1, out, start) > 0,
        "a planted panic was missed"
    );
    assert!(
        run_target(&mut hog, 300, 1, out, start) > 0,
        "a planted allocation was missed"
    );
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--self-test-hang")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.code() == Some(1) && text.contains("a hang"),
        "a planted hang was missed: {:?} {text}",
        child.status
    );
    println!("fuzz self-test: a planted panic, allocation and hang are each caught");
}

fn main() {
    let mut cases: u64 = 100_000;
    let mut seed: u64 = 1;
    let mut mode = "";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).and_then(|v| v.parse().ok());
        match (args[i].as_str(), value) {
            ("--cases", Some(v)) => cases = v,
            ("--seed", Some(v)) => seed = v,
            ("--self-test", _) => mode = "self-test",
            ("--self-test-hang", _) => mode = "hang",
            _ => {
                eprintln!("usage: fuzz [--cases N] [--seed S] | --self-test");
                std::process::exit(2);
            }
        }
        i += if mode.is_empty() { 2 } else { 1 };
    }
    let start = Instant::now();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        let at = CASE_STARTED.load(Ordering::Relaxed);
        if at != 0 && start.elapsed().as_nanos() as u64 - at > CASE_TIME_MAX.as_nanos() as u64 {
            eprintln!(
                "fuzz: a case ran past {CASE_TIME_MAX:?}: a hang (the input is the last one saved)"
            );
            std::process::exit(1);
        }
    });
    // Panics are caught and reported once each, not printed as they happen.
    std::panic::set_hook(Box::new(|_| {}));
    let out = Path::new("target/fuzz");
    std::fs::create_dir_all(out).unwrap();
    match mode {
        "self-test" => return self_test(out, start),
        "hang" => {
            let mut stuck = Target {
                name: "self-test hang",
                seeds: Vec::new(),
                run: Box::new(|_| loop {
                    std::thread::sleep(Duration::from_secs(1));
                }),
            };
            run_target(&mut stuck, 1, 1, out, start);
            return;
        }
        _ => {}
    }
    let targets = [
        frames(),
        raft_messages(),
        raft_log(),
        checkpoints(),
        cluster_state(),
        config(),
        rdma(),
        nbd(),
        nbd_tls(),
    ];
    println!("fuzz: {cases} cases a target, seed {seed}");
    let mut failures = 0;
    for mut t in targets {
        failures += run_target(&mut t, cases, seed, out, start);
    }
    if failures > 0 {
        println!("fuzz: {failures} failures");
        std::process::exit(1);
    }
    println!("fuzz: no panic, hang or unbounded allocation");
}
