use super::*;
use crate::device::DevError;
use crate::ids::NodeId;
use proptest::prelude::*;

fn data() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..9000).prop_map(Bytes::from)
}

fn weir_error() -> impl Strategy<Value = WeirError> {
    prop_oneof![
        any::<u32>().prop_map(|v| WeirError::UnknownVolume(VolumeId(v))),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(l, b, c)| WeirError::OutOfRange {
            lba: Lba(l),
            blocks: b,
            capacity: c
        }),
        any::<u32>().prop_map(|n| WeirError::NotPrimary(NodeId(n))),
        (any::<u64>(), any::<u64>()).prop_map(|(g, c)| WeirError::StaleEpoch {
            got: Epoch(g),
            current: Epoch(c)
        }),
        any::<u64>().prop_map(|l| WeirError::Device(DevError::Media(Lba(l)))),
        Just(WeirError::Busy),
        any::<u32>().prop_map(|n| WeirError::NoLease(NodeId(n))),
        Just(WeirError::PayloadNotHeld),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    let id = any::<u64>();
    prop_oneof![
        (id, any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(r, v, e, l, b)| {
            Message::Read {
                req: RequestId(r),
                volume: VolumeId(v),
                epoch: Epoch(e),
                lba: Lba(l),
                blocks: b,
                delta: 1,
            }
        }),
        (
            id,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            data(),
            any::<bool>()
        )
            .prop_map(|(r, v, e, l, data, fua)| Message::Write {
                req: RequestId(r),
                volume: VolumeId(v),
                epoch: Epoch(e),
                lba: Lba(l),
                data,
                fua,
                delta: 1,
            }),
        (id, any::<u32>()).prop_map(|(r, v)| Message::Flush {
            req: RequestId(r),
            volume: VolumeId(v)
        }),
        (id, data()).prop_map(|(r, data)| Message::ReadOk {
            req: RequestId(r),
            data
        }),
        id.prop_map(|r| Message::WriteOk { req: RequestId(r) }),
        (id, weir_error()).prop_map(|(r, error)| Message::Failed {
            req: RequestId(r),
            error
        }),
        (
            id,
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            data(),
            any::<bool>(),
            (any::<u32>(), any::<u64>()),
        )
            .prop_map(|(o, x, e, v, l, data, fua, (c, r))| Message::ReplicaWrite {
                op: OpId(o),
                extent: ExtentId(x),
                epoch: Epoch(e),
                version: Version(v),
                prev: (Version(v / 3), Version(l)),
                settled: Version(v / 2),
                origin: (NodeId(c), RequestId(r)),
                lba: Lba(l),
                data,
                fua,
            }),
        (id, prop::option::of(weir_error())).prop_map(|(o, e)| Message::ReplicaWriteAck {
            op: OpId(o),
            result: e.map_or(Ok(()), Err)
        }),
        id.prop_map(|o| Message::ReplicaFlush { op: OpId(o) }),
        control_message(),
    ]
}

/// The control-plane messages.
fn control_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        data().prop_map(|bytes| Message::Raft { bytes }),
        (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(sent_ns, applied, healthy)| {
            Message::Heartbeat {
                sent_ns,
                applied,
                healthy,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(sent_ns, lease_until_ns)| {
            Message::HeartbeatAck {
                sent_ns,
                lease_until_ns,
            }
        }),
        any::<u64>().prop_map(|r| Message::GetMap { req: RequestId(r) }),
        (any::<u64>(), data()).prop_map(|(r, state)| Message::MapState {
            req: RequestId(r),
            state
        }),
        data().prop_map(|command| Message::Propose { command }),
        (any::<u64>(), rebuild_copy(data()))
            .prop_map(|(o, copy)| Message::RebuildWrite { op: OpId(o), copy }),
        (any::<u64>(), prop::option::of(weir_error())).prop_map(|(o, e)| Message::RebuildAck {
            op: OpId(o),
            result: e.map_or(Ok(()), Err)
        }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(o, x, e, l, b)| Message::FetchBlocks {
                op: OpId(o),
                extent: ExtentId(x),
                epoch: Epoch(e),
                lba: Lba(l),
                blocks: b
            }),
        (any::<u64>(), data(), prop::option::of(weir_error()))
            .prop_map(|(o, d, e)| Message::fetched(OpId(o), e.map_or(Ok(d), Err))),
        (any::<u64>(), rebuild_copy(Just(Bytes::new())))
            .prop_map(|(o, copy)| Message::RebuildProbe { op: OpId(o), copy }),
        (
            any::<u64>(),
            any::<(u32, u32)>(),
            prop::option::of(weir_error())
        )
            .prop_map(|(o, r, e)| Message::RebuildProbeOk {
                op: OpId(o),
                result: e.map_or(Ok(r), Err)
            }),
        (
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec((any::<u64>(), any::<u32>()), 0..40)
        )
            .prop_map(|(x, e, b)| Message::ReconcileTail {
                extent: ExtentId(x),
                reign: Epoch(e),
                blocks: b.into_iter().map(|(l, n)| (Lba(l), n)).collect(),
            }),
    ]
}

/// A rebuild run with `data` (a copy's blocks, or none for a probe).
fn rebuild_copy(data: impl Strategy<Value = Bytes>) -> impl Strategy<Value = RebuildCopy> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec(any::<u64>(), 0..40),
        data,
    )
        .prop_map(|(x, e, l, v, data)| RebuildCopy {
            extent: ExtentId(x),
            epoch: Epoch(e),
            lba: Lba(l),
            versions: v.into_iter().map(Version).collect(),
            data,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn round_trip(msg in message()) {
        let frame = msg.encode().unwrap();
        // The payload is shared with the message, not copied.
        if let Some(data) = msg.payload() {
            prop_assert_eq!(frame.payload.as_ptr(), data.as_ptr());
        }
        prop_assert_eq!(Message::decode(frame.clone()).unwrap(), msg.clone());
        // Received in one piece (a stream), the payload is sliced out of it.
        let whole = frame.to_contiguous();
        let msg_again = Message::decode_bytes(whole.clone()).unwrap();
        if let Some(data) = msg_again.payload().filter(|d| !d.is_empty()) {
            let at = data.as_ptr() as usize - whole.as_ptr() as usize;
            prop_assert_eq!(at, frame.head.len());
        }
        prop_assert_eq!(msg_again, msg);
    }

    #[test]
    fn every_truncation_is_an_error(msg in message(), cut in any::<prop::sample::Index>()) {
        let frame = msg.encode().unwrap().to_contiguous();
        let cut = cut.index(frame.len());
        prop_assert!(Message::decode_bytes(frame.slice(..cut)).is_err());
    }

    #[test]
    fn corrupted_frames_never_panic(
        msg in message(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut frame = msg.encode().unwrap().to_contiguous().to_vec();
        for (at, byte) in flips {
            let i = at.index(frame.len());
            frame[i] = byte;
        }
        // Either a typed error or some message: never a panic.
        let _ = Message::decode_bytes(frame.into());
    }
}

proptest! {
    // The issue asks for at least 10,000 cases of random input in every test run.
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Message::decode_bytes(bytes.into());
    }

    #[test]
    fn random_bodies_behind_a_valid_header_are_rejected_or_decoded(
        body in prop::collection::vec(any::<u8>(), 0..512),
        split in any::<prop::sample::Index>(),
    ) {
        // Any split of the body into a control part and a payload.
        let control = split.index(body.len() + 1);
        let mut frame = Vec::with_capacity(HEADER_BYTES + body.len());
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&[WIRE_VERSION, 0]);
        frame.extend_from_slice(&(control as u32).to_le_bytes());
        frame.extend_from_slice(&((body.len() - control) as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        if let Ok(msg) = Message::decode_bytes(frame.into()) {
            // Whatever decodes must survive a round trip unchanged, or two peers could
            // disagree about what a frame says.
            let again = Message::decode(msg.encode().unwrap()).unwrap();
            prop_assert_eq!(again, msg);
        }
    }

    #[test]
    fn oversized_declared_lengths_are_rejected_before_allocation(
        declared in (MAX_BODY_BYTES as u32 + 1)..=u32::MAX,
        control in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // However the declared bytes split between the control part and payload.
        let control = control.index(declared as usize + 1) as u32;
        let mut frame = Vec::new();
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&[WIRE_VERSION, 0]);
        frame.extend_from_slice(&control.to_le_bytes());
        frame.extend_from_slice(&(declared - control).to_le_bytes());
        frame.extend_from_slice(&tail);
        prop_assert_eq!(
            Message::decode_bytes(frame.into()),
            Err(DecodeError::TooLarge(declared))
        );
    }
}

#[test]
fn a_payload_comes_only_with_a_message_that_carries_one() {
    let mut frame = Message::WriteOk { req: RequestId(1) }.encode().unwrap();
    frame.payload = Bytes::from_static(b"abcd");
    // The header must announce it too, or the lengths disagree.
    assert!(matches!(
        Message::decode(frame.clone()),
        Err(DecodeError::LengthMismatch { .. })
    ));
    let mut head = frame.head.to_vec();
    head[8..12].copy_from_slice(&4u32.to_le_bytes());
    frame.head = head.into();
    assert_eq!(Message::decode(frame), Err(DecodeError::Trailing(4)));
    // A write's data is its payload, kept apart from the control part.
    let msg = Message::Write {
        req: RequestId(1),
        volume: VolumeId(1),
        epoch: Epoch(1),
        lba: Lba(0),
        data: Bytes::from_static(b"abc"),
        fua: false,
        delta: 1,
    };
    let frame = msg.encode().unwrap();
    assert_eq!(&frame.payload[..], b"abc");
    assert!(!frame.head.windows(3).any(|w| w == b"abc"));
    assert_eq!(Message::decode(frame).unwrap(), msg);
}

#[test]
fn wrong_version_and_magic_are_typed() {
    let mut frame = Message::WriteOk { req: RequestId(9) }
        .encode()
        .unwrap()
        .to_contiguous()
        .to_vec();
    frame[2] = WIRE_VERSION + 1;
    assert_eq!(
        Message::decode_bytes(frame.clone().into()),
        Err(DecodeError::Version(WIRE_VERSION + 1))
    );
    frame[0] = b'X';
    assert!(matches!(
        Message::decode_bytes(frame.into()),
        Err(DecodeError::BadMagic(_))
    ));
    let mut frame = Message::WriteOk { req: RequestId(9) }
        .encode()
        .unwrap()
        .to_contiguous()
        .to_vec();
    frame.push(0);
    assert!(matches!(
        Message::decode_bytes(frame.into()),
        Err(DecodeError::LengthMismatch { .. })
    ));
    // The reserved byte set: framed like a message, but not one.
    let mut frame = Message::WriteOk { req: RequestId(9) }
        .encode()
        .unwrap()
        .to_contiguous()
        .to_vec();
    frame[3] = 0xA7;
    assert_eq!(
        Message::decode_bytes(frame.into()),
        Err(DecodeError::Reserved(0xA7))
    );
}
