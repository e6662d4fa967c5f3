//! The daemon over its RDMA transport: three nodes in one process, their
//! endpoints on the in-process loopback NIC (weir-transport-rdma's
//! `net::loopback`, which keeps RC's rules), serving a real client. It
//! exercises everything of `[transport] kind = "rdma"` but the verbs calls,
//! which need an RDMA NIC: the daemon's wiring, the driver, its side
//! channels, credits and granted regions under the replication engine's
//! traffic. qemu-io (Debian's qemu-utils, which `.ci/run` installs) is the
//! client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_real as tokio;
use weir_core::NodeId;
use weir_node::admin_client;
use weir_node::config::Config;
use weir_node::net::Net;
use weir_transport_rdma::net::loopback::LoopFabric;
use weir_transport_rdma::net::RdmaTransport;

/// A free port on loopback (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw", uri];
    for c in commands {
        args.extend(["-c", c]);
    }
    let out = Command::new("qemu-io")
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("qemu-io is needed ({e}); .ci/run installs it"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ qemu-io {}\n{text}", args.join(" "));
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(!text.contains("verification failed"), "{text}");
    text
}

#[test]
fn three_nodes_over_rdma_serve_a_real_client() {
    let dir = std::env::temp_dir().join(format!("weir-rdma-loopback-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ports: Vec<[u16; 3]> = (0..3)
        .map(|_| [free_port(), free_port(), free_port()])
        .collect();
    let members: Vec<String> = (1..=3)
        .map(|n| {
            format!(
                "  {{ id = {n}, addr = \"127.0.0.1:{}\" }},",
                ports[n - 1][0]
            )
        })
        .collect();
    // The side channels run under the members' TLS, as a deployment's would.
    let certs = dir.join("certs");
    weir_node::certs::init(&certs, &[1, 2, 3]).unwrap();
    let configs: Vec<Config> = (1..=3)
        .map(|n| {
            let text = format!(
                "[node]\nid = {n}\ndata_dir = {:?}\n\n\
                 [cluster]\nreplicas = 3\npool_size = \"1G\"\nmembers = [\n{}\n]\n\n\
                 [nbd]\nlisten = \"127.0.0.1:{}\"\n\n\
                 [admin]\nlisten = \"127.0.0.1:{}\"\n\n\
                 [transport]\nkind = \"rdma\"\n\n\
                 [tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
                dir.join(format!("node{n}")),
                members.join("\n"),
                ports[n - 1][1],
                ports[n - 1][2],
                certs.join("ca.pem"),
                certs.join(format!("node-{n}.pem")),
                certs.join(format!("node-{n}.key")),
            );
            Config::parse(&text, Path::new("weir.toml")).unwrap()
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fabric = LoopFabric::new();
    let mut stops = Vec::new();
    let mut nodes = Vec::new();
    let mut endpoints = Vec::new();
    for config in &configs {
        let me = NodeId(config.node.id);
        let peers: BTreeMap<NodeId, SocketAddr> = config
            .cluster
            .members
            .iter()
            .map(|m| (NodeId(m.id), m.addr))
            .collect();
        let node_peers = peers
            .clone()
            .into_iter()
            .filter(|(n, _)| *n != me)
            .collect();
        let cfg = weir_node::rdma::settings(config).unwrap();
        let (t, c) = rt.block_on(async {
            let t = RdmaTransport::bind(
                me,
                Some(config.my_addr()),
                node_peers,
                cfg.clone(),
                fabric.nic(1),
            )
            .await
            .unwrap();
            let client = weir_core::front_end::front_end_of(me);
            let c = RdmaTransport::bind(client, None, peers, cfg, fabric.nic(1))
                .await
                .unwrap();
            (t, c)
        });
        endpoints.push(t.clone());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        stops.push(stop);
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let given = Some((Net::Rdma(t), Net::Rdma(c)));
        nodes.push(rt.spawn(weir_node::daemon::run_on(config.clone(), shutdown, given)));
    }

    // Up: every node's admin endpoint answers and names a Raft leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    for config in &configs {
        let addr = config.admin_addr().to_string();
        while !admin_client::get(&addr, None, "/status")
            .is_ok_and(|s| !s.contains("raft leader: none"))
        {
            assert!(Instant::now() < deadline, "the nodes did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let token = admin_client::read_token(&configs[0].admin_token_path());
    let admin = configs[0].admin_addr().to_string();
    admin_client::post(&admin, token.as_deref(), "/volumes/vol?size=67108864")
        .expect("the volume is created");

    // Written through node 1, read back through every node: each front end
    // reaches the volume's primaries, and the primary its replicas, over RDMA.
    let nbd = |n: usize| format!("nbd://{}/vol", configs[n].nbd.listen);
    qemu_io(
        &nbd(0),
        &[
            "write -P 0xab 0 1M",
            "write -P 0xcd 1M 64k",
            "write -P 0x11 3000 1000",
            "flush",
        ],
    );
    for n in 0..3 {
        qemu_io(
            &nbd(n),
            &[
                "read -P 0xab 0 3000",
                "read -P 0x11 3000 1000",
                "read -P 0xcd 1M 64k",
            ],
        );
    }
    for (i, t) in endpoints.iter().enumerate() {
        let c = t.counters();
        println!("node {}: {c:?}", i + 1);
        assert!(
            c.connects >= 2,
            "node {} set up its connections: {c:?}",
            i + 1
        );
        assert_eq!(c.refused, 0, "node {}: {c:?}", i + 1);
    }

    let connects = admin_client::metric(&admin, "weir_rdma_connects").unwrap();
    assert!(connects >= Some(2), "/metrics: {connects:?}");
    // Node 3 stops: its connections close under the others, whose writes go
    // on without it (its replicas dropped after the replica timeout).
    stops[2].send(true).unwrap();
    rt.block_on(nodes.pop().unwrap())
        .expect("node 3's task ends")
        .expect("node 3 stops cleanly");
    qemu_io(&nbd(0), &["write -P 0x5a 2M 256k", "flush"]);
    qemu_io(&nbd(1), &["read -P 0x5a 2M 256k", "read -P 0xab 0 3000"]);
    let c = endpoints[0].counters();
    assert!(
        c.resets >= 1,
        "node 1 saw node 3's connections close: {c:?}"
    );

    for stop in &stops {
        let _ = stop.send(true);
    }
    for node in nodes {
        rt.block_on(node)
            .expect("the node task ends")
            .expect("the node stops cleanly");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
