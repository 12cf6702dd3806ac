//! Two nodes form a ring over QUIC on loopback, with a throwaway cluster CA (every link is
//! mutually authenticated and encrypted), and average a buffer.
//!
//! `cargo run -p ringtune-quic --example two_nodes`

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use ringtune_collective::{Collective, RingMode, Wire};
use ringtune_quic::certs::generate;
use ringtune_quic::{Peers, QuicRing, RingOptions, Tuning};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let certs = generate(2)?;
    let ports: Vec<u16> = {
        let sockets = [UdpSocket::bind("127.0.0.1:0")?, UdpSocket::bind("127.0.0.1:0")?];
        sockets.iter().map(|s| s.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?
    };
    let peers = Peers::List(ports.iter().map(|p| format!("127.0.0.1:{p}")).collect());
    let nodes: Vec<_> = (0..2)
        .map(|rank| {
            let options = RingOptions {
                rank,
                world: 2,
                layout: [0; 32],
                identity: certs.identity(rank)?,
                listen: SocketAddr::from(([127, 0, 0, 1], ports[rank])),
                peers: peers.clone(),
                deadline: Duration::from_secs(10),
                rendezvous_deadline: Duration::from_secs(10),
                tuning: Tuning::default(),
            };
            Ok(std::thread::spawn(move || -> Result<Vec<f32>, String> {
                let mut ring = Collective::new(QuicRing::join(options).map_err(|e| e.to_string())?);
                let mut grads = vec![rank as f32 + 1.0; 1 << 20];
                ring.run(&mut grads, RingMode::AllReduceMean, Wire::F32).map_err(|e| e.to_string())?;
                ring.into_transport().shutdown();
                Ok(grads)
            }))
        })
        .collect::<Result<_, ringtune_quic::QuicError>>()?;
    for (rank, node) in nodes.into_iter().enumerate() {
        let grads = node.join().map_err(|_| "a node panicked")??;
        println!("rank {rank}: mean of 1 and 2 over {} floats = {}", grads.len(), grads[0]);
    }
    Ok(())
}
