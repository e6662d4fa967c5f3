//! dmClock admission against a model: closed-loop volumes (each keeps `qd`
//! requests outstanding, spread round robin over the servers, carrying the
//! deltas of [`Deltas`]) and servers whose engine serves admitted requests one
//! at a time, `service_ns` each. Time is simulated, event by event.

use super::admission::*;
use crate::control::state::Qos;
use crate::ids::{NodeId, RequestId};
use std::collections::VecDeque;

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

struct Vol {
    key: VolKey,
    qos: Qos,
    qd: usize,
    bytes: u64,
    start_ns: u64,
    outstanding: usize,
    next_server: usize,
    /// Completion times.
    done: Vec<u64>,
    refused: u64,
}

fn vol(first: u64, qos: Qos) -> Vol {
    Vol {
        key: Some(first),
        qos,
        qd: 16,
        bytes: 4096,
        start_ns: 0,
        outstanding: 0,
        next_server: first as usize,
        done: Vec::new(),
        refused: 0,
    }
}

fn qos(iops_limit: u64, iops_reservation: u64, weight: u32) -> Qos {
    Qos {
        iops_limit,
        bw_limit: 0,
        iops_reservation,
        weight,
    }
}

struct Server {
    adm: Admission<(usize, Who)>,
    engine: VecDeque<(usize, Who)>,
    /// The request in service and when it completes.
    busy: Option<(u64, usize, Who)>,
}

/// Run `vols` on `servers` servers until `until_ns`.
fn run(servers: usize, depth: usize, service_ns: u64, vols: &mut [Vol], until_ns: u64) {
    let mut sv: Vec<Server> = (0..servers)
        .map(|_| Server {
            adm: Admission::new(AdmitConfig {
                depth,
                waiting_max: 1024,
            }),
            engine: VecDeque::new(),
            busy: None,
        })
        .collect();
    let mut deltas = Deltas::default();
    let mut next_req = 0u64;
    let mut now = 0u64;
    while now < until_ns {
        // Completions at `now`.
        for (s, server) in sv.iter_mut().enumerate() {
            if let Some((at, v, who)) = server.busy {
                if at <= now {
                    server.busy = None;
                    assert!(server.adm.finish(who));
                    vols[v].outstanding -= 1;
                    vols[v].done.push(at);
                    let _ = s;
                }
            }
        }
        // Volumes issue up to their depth.
        for (i, v) in vols.iter_mut().enumerate() {
            while v.start_ns <= now && v.outstanding < v.qd {
                let s = v.next_server % servers;
                v.next_server += 1;
                next_req += 1;
                let who = (NodeId(1000 + i as u32), RequestId(next_req));
                let delta = deltas.delta(v.key, NodeId(s as u32));
                v.outstanding += 1;
                match sv[s]
                    .adm
                    .submit(v.key, v.qos, (who, delta, v.bytes), (i, who), now)
                {
                    Submit::Queued => {}
                    Submit::Refused(_) => {
                        v.outstanding -= 1;
                        v.refused += 1;
                        break;
                    }
                    Submit::Again(_) => unreachable!("ids are fresh"),
                }
            }
        }
        // Servers admit and serve.
        for server in sv.iter_mut() {
            for (i, _) in server.adm.expired(now) {
                vols[i].outstanding -= 1;
                vols[i].refused += 1;
            }
            while let Some(item) = server.adm.poll(now) {
                server.engine.push_back(item);
            }
            if server.busy.is_none() {
                if let Some((v, who)) = server.engine.pop_front() {
                    server.busy = Some((now + service_ns, v, who));
                }
            }
            server.adm.self_check();
        }
        // The next event.
        let next = sv
            .iter()
            .flat_map(|s| [s.busy.map(|b| b.0), s.adm.next_wake(now)])
            .chain(vols.iter().map(|v| Some(v.start_ns).filter(|&t| t > now)))
            .flatten()
            .min();
        match next {
            Some(t) => {
                assert!(t > now, "time moves on");
                now = t;
            }
            None => break,
        }
    }
}

/// Completions of `v` in `[from, to)`.
fn done_in(v: &Vol, from: u64, to: u64) -> usize {
    v.done.iter().filter(|&&t| t >= from && t < to).count()
}

fn within(got: usize, want: f64, tolerance: f64) -> bool {
    (got as f64 - want).abs() <= want * tolerance
}

#[test]
fn a_limit_holds_on_one_server() {
    let mut vols = [vol(0, qos(1000, 0, 100))];
    run(1, 8, 100_000, &mut vols, 2 * S);
    let got = done_in(&vols[0], S, 2 * S);
    assert!(within(got, 1000.0, 0.01), "{got} IOPS under a 1000 limit");
}

#[test]
fn a_limit_holds_across_servers_through_the_deltas() {
    // Each server alone could give the volume 10,000 IOPS: only the deltas keep
    // the four together at the limit.
    let mut vols = [vol(0, qos(1000, 0, 100))];
    run(4, 8, 100_000, &mut vols, 2 * S);
    let got = done_in(&vols[0], S, 2 * S);
    assert!(within(got, 1000.0, 0.03), "{got} IOPS under a 1000 limit");
}

#[test]
fn without_deltas_each_server_would_give_the_limit() {
    // The same volume with a client that carries no deltas (each request 1):
    // the check above can fail.
    let mut adms: Vec<Admission<u64>> = (0..4)
        .map(|_| Admission::new(AdmitConfig::default()))
        .collect();
    let q = qos(1000, 0, 100);
    let mut admitted = 0;
    for n in 0..40_000u64 {
        let now = n * 25_000; // 40,000 requests over one second
        let s = (n % 4) as usize;
        let who = (NodeId(9), RequestId(n));
        let _ = adms[s].submit(Some(0), q, (who, 1, 4096), n, now);
        while let Some(m) = adms[s].poll(now) {
            admitted += 1;
            adms[s].finish((NodeId(9), RequestId(m)));
        }
    }
    assert!(admitted > 3500, "{admitted}: four servers, 1000 each");
}

#[test]
fn a_bandwidth_limit_holds() {
    let mut v = vol(0, qos(0, 0, 100));
    v.qos.bw_limit = 500 * 65536;
    v.bytes = 65536;
    let mut vols = [v];
    run(2, 8, 50_000, &mut vols, 2 * S);
    let got = done_in(&vols[0], S, 2 * S);
    assert!(
        within(got, 500.0, 0.03),
        "{got} requests of 64 KiB under 32 MB/s"
    );
}

#[test]
fn weights_share_what_is_left() {
    let mut vols = [vol(0, qos(0, 0, 100)), vol(1, qos(0, 0, 300))];
    run(1, 1, MS, &mut vols, 2 * S);
    let (a, b) = (done_in(&vols[0], S, 2 * S), done_in(&vols[1], S, 2 * S));
    assert!(within(a, 250.0, 0.04), "weight 100 of 400: {a}");
    assert!(within(b, 750.0, 0.04), "weight 300 of 400: {b}");
}

#[test]
fn a_reservation_is_kept_against_a_heavier_weight() {
    let mut vols = [vol(0, qos(0, 400, 1)), vol(1, qos(0, 0, 1000))];
    run(1, 1, MS, &mut vols, 2 * S);
    let (a, b) = (done_in(&vols[0], S, 2 * S), done_in(&vols[1], S, 2 * S));
    assert!(a >= 395, "400 reserved, got {a}");
    assert!(a + b >= 995, "the server stays busy: {a} + {b}");
}

#[test]
fn a_reservation_is_kept_across_servers() {
    let mut vols = [vol(0, qos(0, 1200, 1)), vol(1, qos(0, 0, 1000))];
    vols[0].qd = 32;
    vols[1].qd = 32;
    run(3, 1, MS, &mut vols, 2 * S);
    let (a, b) = (done_in(&vols[0], S, 2 * S), done_in(&vols[1], S, 2 * S));
    assert!(a >= 1170, "1200 reserved over three servers, got {a}");
    assert!(a + b >= 2950, "the servers stay busy: {a} + {b}");
}

#[test]
fn a_limited_volume_leaves_the_rest_to_others() {
    let mut vols = [vol(0, qos(200, 0, 100)), vol(1, qos(0, 0, 100))];
    run(1, 1, MS, &mut vols, 2 * S);
    let (a, b) = (done_in(&vols[0], S, 2 * S), done_in(&vols[1], S, 2 * S));
    assert!(within(a, 200.0, 0.02), "limited to 200: {a}");
    assert!(b >= 790, "the other takes the rest: {b}");
}

#[test]
fn a_newcomer_gets_its_share_not_a_burst() {
    // A runs alone for a second, its P tags far ahead of the clock; B, of the
    // same weight, joins: it shares, it does not take the server for itself.
    let mut vols = [vol(0, qos(0, 0, 100)), vol(1, qos(0, 0, 100))];
    vols[1].start_ns = S;
    run(1, 1, MS, &mut vols, 2 * S);
    let (a, b) = (
        done_in(&vols[0], S, S + 100 * MS),
        done_in(&vols[1], S, S + 100 * MS),
    );
    assert!(
        a >= 40 && b >= 40,
        "shared in B's first 100 ms: {a} and {b}"
    );
}

#[test]
fn bounds_refuse_and_expire() {
    let mut adm: Admission<u64> = Admission::new(AdmitConfig {
        depth: 1,
        waiting_max: 2,
    });
    let q = qos(10, 0, 100); // one request per 100 ms
    let who = |n| (NodeId(1), RequestId(n));
    let key = Some(0);
    for n in 0..2 {
        assert_eq!(adm.submit(key, q, (who(n), 1, 4096), n, 0), Submit::Queued);
    }
    assert_eq!(
        adm.submit(key, q, (who(2), 1, 4096), 2, 0),
        Submit::Refused(2)
    );
    assert_eq!(adm.poll(0), Some(0));
    // A retry of the request in the engine goes to the engine again.
    assert_eq!(
        adm.submit(key, q, (who(0), 1, 4096), 0, MS),
        Submit::Again(0)
    );
    // The slot is taken: nothing goes, and no wake-up is due until it frees.
    assert_eq!(adm.poll(MS), None);
    assert_eq!(adm.next_wake(MS), None);
    assert!(adm.finish(who(0)));
    // Request 1's limit tag is 100 ms.
    assert_eq!(adm.next_wake(MS), Some(100 * MS));
    assert_eq!(adm.poll(99 * MS), None);
    assert_eq!(adm.poll(100 * MS), Some(1));
    assert_eq!(adm.forget_old(100 * MS + ADMIT_FORGET_NS), 1);
    // One more waits; past the longest wait it is handed back for `Busy`.
    assert_eq!(
        adm.submit(key, q, (who(3), 1, 4096), 3, 100 * MS),
        Submit::Queued
    );
    assert_eq!(
        adm.submit(key, q, (who(4), 1, 4096), 4, 100 * MS),
        Submit::Queued
    );
    assert!(adm.poll(100 * MS).is_none(), "limit tag 200 ms");
    assert_eq!(adm.expired(100 * MS + ADMIT_WAIT_MAX_NS), vec![3, 4]);
    assert_eq!(adm.waiting(), 0);
    let stats = adm.stats();
    assert_eq!(stats[0].1.refused, 3);
    assert_eq!(stats[0].1.admitted, 2);
    assert_eq!(
        stats[0].1.throttled_ns,
        100 * MS,
        "request 1 held by its limit"
    );
    adm.self_check();
}

#[test]
fn deltas_count_requests_sent_elsewhere() {
    let mut d = Deltas::default();
    let key = Some(4);
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    assert_eq!(d.delta(key, a), 1);
    // A node's first request counts only itself (a new primary after a
    // failover is not handed the volume's whole past).
    assert_eq!(d.delta(key, b), 1, "the first to b");
    assert_eq!(d.delta(key, a), 2, "one sent to b since");
    assert_eq!(d.delta(key, a), 1, "none elsewhere since");
    assert_eq!(d.delta(key, c), 1, "the first to c");
    assert_eq!(d.delta(key, b), 4, "a, a, c since");
    // Other volumes count apart.
    assert_eq!(d.delta(Some(8), a), 1);
    // Every request is counted once at each node: the deltas a node saw add up
    // to the volume's requests up to its last one there.
    let mut d = Deltas::default();
    let mut at_a = 0;
    for n in 0..100u32 {
        let node = NodeId(n % 3 + (n % 7) % 2);
        let delta = d.delta(key, node);
        if node == a {
            at_a += delta;
        }
    }
    assert!((95..=100).contains(&at_a), "{at_a}");
}

#[test]
fn a_limit_holds_with_more_waiting_than_it_admits_before_they_give_up() {
    // 16 outstanding at 50 IOPS: each waits 320 ms, past the 200 ms a request
    // may wait, so some are answered busy and sent again. Tags spaced from the
    // requests admitted keep the volume at its limit (tagged at arrival, the
    // refused ones pushed the tags ever further ahead and it starved).
    let mut vols = [vol(0, qos(50, 0, 100))];
    run(1, 8, 100_000, &mut vols, 3 * S);
    let got = done_in(&vols[0], S, 3 * S);
    assert!(
        within(got, 100.0, 0.03),
        "{got} in 2 s under a 50 IOPS limit"
    );
    assert!(
        vols[0].refused > 0,
        "the check can fail: none waited too long"
    );
}

#[test]
fn a_reservation_does_not_pass_the_bandwidth_limit() {
    let mut v = vol(0, qos(0, 1000, 100));
    v.qos.bw_limit = 100 * 65536;
    v.bytes = 65536;
    let mut vols = [v];
    run(1, 8, 100_000, &mut vols, 2 * S);
    let got = done_in(&vols[0], S, 2 * S);
    assert!(
        within(got, 100.0, 0.03),
        "{got} of 64 KiB under 6.5 MB/s, 1000 reserved"
    );
}
