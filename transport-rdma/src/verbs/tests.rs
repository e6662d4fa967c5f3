//! Layout and device-check tests (they run everywhere), and the device tests
//! (`cargo xtask test-rdma`, on a machine with an RDMA device).

use super::*;
use std::mem::size_of;

#[test]
fn the_bindings_lay_structs_out_as_rdma_cores_headers_do() {
    // Sizes of rdma-core 44's <infiniband/verbs.h> on x86-64 (gcc's sizeof).
    assert_eq!(size_of::<sys::ibv_wc>(), 48);
    assert_eq!(size_of::<sys::ibv_send_wr>(), 128);
    assert_eq!(size_of::<sys::ibv_recv_wr>(), 32);
    assert_eq!(size_of::<sys::ibv_sge>(), 16);
    assert_eq!(size_of::<sys::ibv_qp_attr>(), 144);
    assert_eq!(size_of::<sys::ibv_qp_cap>(), 20);
    assert_eq!(size_of::<sys::ibv_gid>(), 16);
    assert_eq!(size_of::<sys::ibv_port_attr>(), 52);
}

#[test]
fn the_device_check_agrees_with_the_kernel() {
    match devices() {
        Ok(devs) => {
            assert!(sysfs_has_device(), "verbs sees {devs:?}, sysfs nothing");
            assert!(devs.iter().all(|d| !d.name.is_empty()));
        }
        Err(e) => {
            assert!(!sysfs_has_device(), "sysfs lists a device, verbs: {e}");
            assert!(matches!(e, VerbsError::NoDevice { .. }), "{e}");
            assert!(e.to_string().starts_with("no RDMA device"), "{e}");
            assert!(
                matches!(Context::open(None), Err(VerbsError::NoDevice { .. })),
                "opening agrees"
            );
        }
    }
}

#[test]
fn mtus_convert_both_ways_and_nothing_else_does() {
    for (e, bytes) in [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
        assert_eq!(mtu_bytes(e), Some(bytes));
        assert_eq!(mtu_enum(bytes), Some(e));
    }
    assert_eq!(mtu_bytes(0), None);
    assert_eq!(mtu_bytes(6), None);
    assert_eq!(mtu_enum(1500), None);
    assert_eq!(mtu_enum(9000), None);
}

#[test]
fn failed_calls_carry_their_errno_whichever_way_the_verb_returns_it() {
    assert_eq!(check("x", 0), Ok(()));
    let e = check("ibv_modify_qp", 22).unwrap_err();
    assert_eq!(
        e,
        VerbsError::Call {
            call: "ibv_modify_qp",
            errno: 22
        }
    );
    assert!(
        e.to_string().starts_with("ibv_modify_qp: Invalid argument"),
        "{e}"
    );
    assert!(matches!(
        check("ibv_poll_cq", -11),
        Err(VerbsError::Call { errno: 11, .. })
    ));
}

/// A queue pair connected to itself: a SEND lands in its own posted receive,
/// a WRITE_WITH_IMM in its own region.
#[test]
#[ignore = "requires an RDMA device"]
fn a_loopback_queue_pair_sends_and_writes_with_immediate() {
    let ctx = Context::open(None).expect("a device");
    let port = ctx.active_port(1).expect("port 1 active");
    let gid_index = 1; // RoCE v2 GID of the port's IPv4 address on most set-ups
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64).unwrap();
    let mut mr = MemoryRegion::new(&pd, 1 << 16, Access::RemoteWrite).unwrap();
    mr.write(0, &[b"hello"]);
    let qp = Qp::new(
        &pd,
        &cq,
        QpCaps {
            send: 16,
            recv: 16,
            inline: 0,
        },
    )
    .unwrap()
    .init(1)
    .unwrap();
    let me = Remote {
        qpn: qp.qpn(),
        psn: 0x1234,
        gid: ctx.gid(1, gid_index).unwrap(),
        mtu: port.mtu_bytes,
    };
    let qp = qp
        .ready_to_receive(&me, 1, (gid_index, 0), port.mtu_bytes.min(4096))
        .unwrap()
        .ready_to_send(0x1234)
        .unwrap();
    let recv = mr.sge(4096, 4096).unwrap();
    let send = mr.sge(0, 5).unwrap();
    let region = mr.sge(8192, 5).unwrap();
    // SAFETY: `mr` outlives the queue pair's use of it (both live to the end
    // of the test, and every request completes before it).
    unsafe {
        qp.post_recv(1, recv).unwrap();
        qp.post_recv(2, recv).unwrap();
        qp.post_send(3, SendOp::Send, send, true, false).unwrap();
        let op = SendOp::WriteImm {
            remote_addr: region.addr,
            rkey: mr.rkey(),
            imm: 42,
        };
        qp.post_send(4, op, send, true, false).unwrap();
    }
    let mut wcs = Vec::new();
    for _ in 0..1_000_000 {
        cq.poll(&mut wcs, 16).unwrap();
        if wcs.len() == 4 {
            break;
        }
    }
    assert_eq!(wcs.len(), 4, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status.is_ok()), "{wcs:?}");
    let imm = wcs
        .iter()
        .find(|w| w.wr_id == 2)
        .expect("the write's receive");
    assert_eq!(imm.imm, Some(42));
    assert_eq!(&mr.read(4096, 5)[..], b"hello");
    assert_eq!(&mr.read(8192, 5)[..], b"hello");
}
