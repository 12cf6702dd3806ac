//! A lossy, reordering link in user space, for kernels without `netem`: every datagram
//! between a rank and the ring neighbour that sends to it passes through here, where a seeded
//! generator drops some and holds others back behind the next datagram.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How the relay treats datagrams.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Impairment {
    /// Probability of dropping a datagram.
    pub(crate) loss: f64,
    /// Probability of holding a datagram until the next one in the same direction has gone.
    pub(crate) reorder: f64,
}

/// One direction of a relayed link: drops and reorders what it forwards.
struct Direction {
    rng: ChaCha8Rng,
    held: Option<Vec<u8>>,
    impairment: Impairment,
}

impl Direction {
    /// What to send now for datagram `data`, in order: nothing (dropped or held), it, or it
    /// and the one held before it.
    fn pass(&mut self, data: &[u8]) -> Vec<Vec<u8>> {
        if self.rng.random_bool(self.impairment.loss) {
            return Vec::new();
        }
        if self.held.is_none() && self.rng.random_bool(self.impairment.reorder) {
            self.held = Some(data.to_vec());
            return Vec::new();
        }
        let mut out = vec![data.to_vec()];
        out.extend(self.held.take());
        out
    }
}

/// Relays for every rank of a ring: `front(r)` is where the others reach rank `r`.
pub(crate) struct Relays {
    fronts: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
}

impl Relays {
    /// A relay in front of each of `targets`, listening on `host` (ephemeral ports) inside the
    /// network namespace `namespace` (its threads enter it; the process stays where it is).
    pub(crate) fn start(
        namespace: &str,
        host: std::net::IpAddr,
        targets: &[SocketAddr],
        impairment: Impairment,
        seed: u64,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        // Dropped on a failed setup, this stops the relays already started.
        let mut relays = Relays { fronts: Vec::new(), stop: stop.clone() };
        let (namespace, targets, flag) = (namespace.to_string(), targets.to_vec(), stop);
        relays.fronts = std::thread::spawn(move || -> Result<Vec<SocketAddr>> {
            let ns = std::fs::File::open(format!("/run/netns/{namespace}"))?;
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let mut fronts = Vec::new();
            for (r, &target) in targets.iter().enumerate() {
                let front = UdpSocket::bind(SocketAddr::new(host, 0))?;
                front.set_read_timeout(Some(Duration::from_millis(100)))?;
                fronts.push(front.local_addr()?);
                let (stop, seed) = (flag.clone(), seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                // Threads started here are in the namespace too.
                std::thread::spawn(move || relay(front, host, target, impairment, seed, &stop));
            }
            Ok(fronts)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the relay's setup panicked"))??;
        Ok(relays)
    }

    /// The address that reaches rank `r` through its relay.
    pub(crate) fn front(&self, r: usize) -> SocketAddr {
        self.fronts[r]
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn direction(impairment: Impairment, seed: u64) -> Arc<Mutex<Direction>> {
    Arc::new(Mutex::new(Direction { rng: ChaCha8Rng::seed_from_u64(seed), held: None, impairment }))
}

/// Forwards between the clients that write to `front` and `target`, one back socket per client.
fn relay(
    front: UdpSocket,
    host: std::net::IpAddr,
    target: SocketAddr,
    impairment: Impairment,
    seed: u64,
    stop: &Arc<AtomicBool>,
) {
    let front = Arc::new(front);
    let forward = direction(impairment, seed);
    let mut backs: HashMap<SocketAddr, UdpSocket> = HashMap::new();
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, client)) = front.recv_from(&mut buf) else { continue };
        if !backs.contains_key(&client) {
            let Ok(back) = UdpSocket::bind(SocketAddr::new(host, 0)) else { continue };
            let _ = back.set_read_timeout(Some(Duration::from_millis(100)));
            let Ok(reader) = back.try_clone() else { continue };
            let backward = direction(impairment, seed.wrapping_add(1 + backs.len() as u64));
            let (front, stop) = (front.clone(), stop.clone());
            std::thread::spawn(move || back_to_client(&reader, &front, client, &backward, &stop));
            backs.insert(client, back);
        }
        let (Some(back), Ok(mut dir)) = (backs.get(&client), forward.lock()) else { continue };
        for datagram in dir.pass(&buf[..n]) {
            let _ = back.send_to(&datagram, target);
        }
    }
}

/// What the target sends back goes to the client, through the same kind of link.
fn back_to_client(
    back: &UdpSocket,
    front: &UdpSocket,
    client: SocketAddr,
    direction: &Mutex<Direction>,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, _)) = back.recv_from(&mut buf) else { continue };
        let Ok(mut dir) = direction.lock() else { return };
        for datagram in dir.pass(&buf[..n]) {
            let _ = front.send_to(&datagram, client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_drop_and_reorder_at_their_rates() {
        let mut d = Direction {
            rng: ChaCha8Rng::seed_from_u64(1),
            held: None,
            impairment: Impairment { loss: 0.01, reorder: 0.01 },
        };
        let mut sent = Vec::new();
        for i in 0..100_000u32 {
            sent.extend(d.pass(&i.to_le_bytes()).into_iter().map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        }
        let lost = 100_000 - sent.len();
        let reordered = sent.windows(2).filter(|w| w[0] > w[1]).count();
        assert!((800..1200).contains(&lost), "{lost} lost");
        assert!((700..1300).contains(&reordered), "{reordered} reordered");
    }
}
