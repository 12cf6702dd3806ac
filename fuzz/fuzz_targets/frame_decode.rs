//! Fuzzes the frame decoder and the all-reduce state machine behind it: any bytes from a peer
//! must decode to a checked header or an error, and a decoded frame must be taken or refused by
//! the schedule, never panic. The same bytes as a peer's embedding-row list, or as a
//! rendezvous message, must be accepted or refused the same way.

#![no_main]

use bytes::Bytes;
use ringtune_collective::{decode_rows, Header, Hello, RingAllReduce, Schedule, HEADER_LEN, MAX_PAYLOAD};
use libfuzzer_sys::fuzz_target;
use ringtune_quic::RendezvousMessage;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = RendezvousMessage::decode(data) {
        assert_eq!(RendezvousMessage::decode(&message.encode()), Ok(message));
    }
    if let Ok(rows) = decode_rows(1, data, 30_522) {
        assert!(rows.windows(2).all(|w| w[0] < w[1]) && rows.iter().all(|&r| r < 30_522));
    }
    let Ok(header) = Header::decode(data) else { return };
    assert!(header.len <= MAX_PAYLOAD);
    assert_eq!(Header::decode(&header.encode()), Ok(header));
    let payload = Bytes::copy_from_slice(data.get(HEADER_LEN..).unwrap_or(&[]));
    let _ = Hello::decode(&payload);
    for (rank, world) in [(0, 2), (1, 3), (3, 4)] {
        let Ok(schedule) = Schedule::new(rank, world, 1000, 64) else { continue };
        let mut grads = vec![1.0f32; 1000];
        if let Ok(mut op) = RingAllReduce::start(schedule, header.op, &grads) {
            while op.poll_transmit().is_some() {}
            let _ = op.handle_frame(header, payload.clone().into(), &mut grads);
        }
    }
});
