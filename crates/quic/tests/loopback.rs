//! The QUIC ring on loopback: a 4-rank all-reduce (peer list and coordinator), a rank that
//! vanishes or stalls, a node without a CA-signed certificate, nodes that disagree, survivors
//! regrouping, and requests to join that the ring must refuse.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ringtune_collective::{all_reduce_mean, Collective, CollectiveError, RingMode, Transport, Wire};
use ringtune_quic::certs::{generate, ClusterCerts, NodeIdentity};
use ringtune_quic::{Peers, QuicRing, RingOptions, Tuning};

fn free_ports(n: usize) -> Vec<u16> {
    let sockets: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").expect("port")).collect();
    sockets.iter().map(|s| s.local_addr().expect("addr").port()).collect()
}

fn options(
    certs: &ClusterCerts,
    rank: usize,
    world: usize,
    ports: &[u16],
    peers: Peers,
    deadline: Duration,
) -> RingOptions {
    RingOptions {
        rank,
        world,
        layout: [7; 32],
        identity: certs.identity(rank).expect("identity"),
        listen: SocketAddr::from(([127, 0, 0, 1], ports[rank])),
        peers,
        deadline,
        rendezvous_deadline: Duration::from_secs(20),
        tuning: Tuning { segment: 4096, ..Tuning::default() },
    }
}

fn list(ports: &[u16]) -> Peers {
    Peers::List(ports.iter().map(|p| format!("127.0.0.1:{p}")).collect())
}

fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 31 + rank * 17) % 1000) as f32 / 250.0 - 2.0).collect()
}

fn run_ring(world: usize, peers: impl Fn(&[u16]) -> Peers) {
    let certs = generate(world).expect("certs");
    let ports = free_ports(world);
    let len = 100_003;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let o = options(&certs, rank, world, &ports, peers(&ports), Duration::from_secs(20));
            std::thread::spawn(move || {
                let mut ring = Collective::new(QuicRing::join(o).expect("join"));
                let mut grads = data(rank, len);
                for _ in 0..2 {
                    ring.run(&mut grads, RingMode::AllReduceMean, Wire::F32).expect("all-reduce");
                }
                ring.into_transport().shutdown();
                grads
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().expect("rank")).collect();
    for i in (0..len).step_by(997) {
        let mean: f32 = (0..world).map(|r| data(r, len)[i]).sum::<f32>() / world as f32;
        assert!((results[0][i] - mean).abs() < 1e-5, "element {i}");
    }
    for r in &results[1..] {
        assert!(r.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "ranks differ");
    }
}

#[test]
fn four_ranks_all_reduce_over_a_peer_list() {
    run_ring(4, list);
}

#[test]
fn four_ranks_find_each_other_through_a_coordinator() {
    run_ring(4, |ports| Peers::Coordinator(format!("127.0.0.1:{}", ports[0])));
}

#[test]
fn a_vanished_rank_fails_every_other_rank_within_the_deadline() {
    let world = 4;
    let certs = generate(world).expect("certs");
    let ports = free_ports(world);
    let deadline = Duration::from_secs(3);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let o = options(&certs, rank, world, &ports, list(&ports), deadline);
            std::thread::spawn(move || -> Result<(), String> {
                let mut ring = QuicRing::join(o).map_err(|e| e.to_string())?;
                let mut grads = data(rank, 50_000);
                all_reduce_mean(&mut ring, 2, &mut grads, 4096).map_err(|e| e.to_string())?;
                if rank == 2 {
                    // Rank 2 dies: its links go away mid-job.
                    drop(ring);
                    return Ok(());
                }
                let started = Instant::now();
                let result = all_reduce_mean(&mut ring, 3, &mut grads, 4096).map_err(|e| e.to_string());
                let err = result.expect_err("rank 2 is gone");
                ring.abort(&err);
                assert!(started.elapsed() < deadline + Duration::from_secs(2), "took {:?}", started.elapsed());
                Err(err)
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let result = h.join().expect("thread");
        if rank != 2 {
            let err = result.expect_err("an error");
            assert!(err.contains("rank "), "rank {rank}: {err}");
        }
    }
}

/// The killed rank of [`a_killed_rank_is_named_at_the_peer_timeout_not_the_deadline`]: this test
/// binary run again, told by this variable where the certificates and ports are.
const VICTIM: &str = "RINGTUNE_LOOPBACK_VICTIM";

/// Kills the child process when dropped, however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_rank_is_named_at_the_peer_timeout_not_the_deadline() {
    let (world, victim, deadline, len) = (4, 2, Duration::from_secs(60), 50_000);
    if let Ok(spec) = std::env::var(VICTIM) {
        // The victim: joins, takes part in one all-reduce, then waits to be killed.
        let (dir, ports) = spec.split_once(';').expect("dir;ports");
        let ports: Vec<u16> = ports.split(',').map(|p| p.parse().expect("port")).collect();
        let mut o = options(&generate(1).expect("placeholder"), 0, world, &ports, list(&ports), deadline);
        o.rank = victim;
        o.listen = SocketAddr::from(([127, 0, 0, 1], ports[victim]));
        o.identity = NodeIdentity::load(std::path::Path::new(dir), victim).expect("identity");
        let mut ring = QuicRing::join(o).expect("join");
        all_reduce_mean(&mut ring, 1, &mut data(victim, len), 4096).expect("first all-reduce");
        // Its last frames are queued, not yet delivered: time for them to go.
        std::thread::sleep(Duration::from_millis(500));
        println!("{VICTIM} ready");
        std::thread::sleep(deadline);
        return;
    }
    let certs = generate(world).expect("certs");
    let dir = tempfile::tempdir().expect("dir");
    ringtune_quic::certs::write_for_nodes(dir.path(), &certs).expect("write certs");
    let ports = free_ports(world);
    let spec = format!("{};{}", dir.path().display(), ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","));
    let exe = std::env::current_exe().expect("test binary");
    let child = std::process::Command::new(exe)
        .args(["--exact", "a_killed_rank_is_named_at_the_peer_timeout_not_the_deadline", "--nocapture"])
        .env(VICTIM, spec)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("victim");
    let mut child = Killed(child);
    let handles: Vec<_> = (0..world)
        .filter(|&rank| rank != victim)
        .map(|rank| {
            let o = options(&certs, rank, world, &ports, list(&ports), deadline);
            std::thread::spawn(move || -> (CollectiveError, Instant) {
                let mut ring = QuicRing::join(o).expect("join");
                let mut grads = data(rank, len);
                all_reduce_mean(&mut ring, 1, &mut grads, 4096).expect("first all-reduce");
                let err = all_reduce_mean(&mut ring, 2, &mut grads, 4096).expect_err("rank 2 was killed");
                (err, Instant::now())
            })
        })
        .collect();
    let stdout = child.0.stdout.take().expect("victim's stdout");
    let ready = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .any(|line| line == format!("{VICTIM} ready"));
    assert!(ready, "the victim did not get through the first all-reduce");
    // SIGKILL: no goodbye on its links.
    child.0.kill().expect("kill -9");
    let killed = Instant::now();
    let peer_timeout = Tuning::default().peer_timeout;
    for h in handles {
        let (err, named) = h.join().expect("rank");
        let took = named.saturating_duration_since(killed);
        // The loss is data: the neighbours found it, and their closing notes told the rest.
        assert!(matches!(&err, CollectiveError::PeersLost { lost, .. } if lost == &[2]), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("rank 2"), "{err}");
        assert!(took < peer_timeout + Duration::from_secs(3), "named after {took:?}: {err}");
    }
}

#[test]
fn a_stalled_rank_is_named_at_the_deadline() {
    let world = 3;
    let certs = generate(world).expect("certs");
    let ports = free_ports(world);
    let deadline = Duration::from_secs(2);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let o = options(&certs, rank, world, &ports, list(&ports), deadline);
            std::thread::spawn(move || -> Result<(), String> {
                let mut ring = QuicRing::join(o).map_err(|e| e.to_string())?;
                if rank == 1 {
                    // Alive (keep-alives flow) but never takes part.
                    std::thread::sleep(deadline * 3);
                    return Ok(());
                }
                let mut grads = data(rank, 10_000);
                all_reduce_mean(&mut ring, 2, &mut grads, 4096).map_err(|e| e.to_string())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("thread")).collect();
    // Rank 2 receives from the silent rank 1.
    let err = results[2].clone().expect_err("stalled neighbour");
    assert!(err.contains("rank 1") && err.contains("is reachable but sent nothing"), "{err}");
    assert!(results[0].is_err());
}

#[test]
fn a_node_without_a_ca_signed_certificate_is_refused() {
    let world = 2;
    let certs = generate(world).expect("certs");
    let rogue = rcgen::generate_simple_self_signed(vec!["node-1".to_string()]).expect("self-signed");
    let ports = free_ports(world);
    let mut honest = options(&certs, 0, world, &ports, list(&ports), Duration::from_secs(5));
    honest.rendezvous_deadline = Duration::from_secs(4);
    let mut bad = options(&certs, 1, world, &ports, list(&ports), Duration::from_secs(5));
    bad.identity = NodeIdentity::from_pem(1, &rogue.cert.pem(), &rogue.cert.pem(), &rogue.key_pair.serialize_pem())
        .expect("rogue");
    bad.rendezvous_deadline = Duration::from_secs(4);
    let a = std::thread::spawn(move || QuicRing::join(honest).map(|_| ()));
    let b = std::thread::spawn(move || QuicRing::join(bad).map(|_| ()));
    let honest_result = a.join().expect("thread");
    let rogue_result = b.join().expect("thread");
    let rogue_err = rogue_result.expect_err("the rogue cannot join").to_string();
    assert!(rogue_err.contains("refused") || rogue_err.contains("rendezvous"), "{rogue_err}");
    let honest_err = honest_result.expect_err("the honest node has no valid peer").to_string();
    assert!(honest_err.contains("rendezvous") || honest_err.contains("refused"), "{honest_err}");
}

#[test]
fn nodes_that_disagree_fail_before_the_first_step() {
    let world = 2;
    let certs = generate(world).expect("certs");
    let ports = free_ports(world);
    let a = options(&certs, 0, world, &ports, list(&ports), Duration::from_secs(5));
    let mut b = options(&certs, 1, world, &ports, list(&ports), Duration::from_secs(5));
    b.layout = [8; 32];
    let ta = std::thread::spawn(move || QuicRing::join(a).map(|_| ()));
    let tb = std::thread::spawn(move || QuicRing::join(b).map(|_| ()));
    let errors: Vec<String> =
        [ta, tb].into_iter().map(|t| t.join().expect("thread").expect_err("mismatch").to_string()).collect();
    assert!(errors.iter().any(|e| e.contains("another parameter layout")), "{errors:?}");
}

/// How a node of [`lose_and_regroup`] ended: the ids of its last ring and its last result, or
/// why it stopped.
type Outcome = Result<(Vec<usize>, Vec<f32>), String>;

/// A ring of `world` on loopback takes an all-reduce; the ranks in `lost` then leave, one
/// round of the list at a time; after each round the rest regroup (`min_nodes`) and take
/// another. Returns each rank's outcome: the ids of its last ring and the last all-reduce's
/// result, or why it stopped.
fn lose_and_regroup(world: usize, rounds: &[&[usize]], min_nodes: usize) -> Vec<Outcome> {
    let certs = generate(world).expect("certs");
    let ports = free_ports(world);
    let len = 30_011;
    let rounds: Vec<Vec<usize>> = rounds.iter().map(|r| r.to_vec()).collect();
    // Nobody leaves before every node of its ring has the last result (a node's last frames are
    // still queued when its own all-reduce returns): a barrier per ring, for its members.
    let mut members = world;
    let mut barriers = vec![std::sync::Arc::new(std::sync::Barrier::new(members))];
    for lost in &rounds {
        members -= lost.len();
        barriers.push(std::sync::Arc::new(std::sync::Barrier::new(members)));
    }
    let handles: Vec<_> = (0..world)
        .map(|id| {
            let o = options(&certs, id, world, &ports, list(&ports), Duration::from_secs(20));
            let (rounds, barriers) = (rounds.clone(), barriers.clone());
            std::thread::spawn(move || -> Outcome {
                let mut ring = QuicRing::join(o).map_err(|e| e.to_string())?;
                let mut step = 1;
                let mut grads = data(id, len);
                all_reduce_mean(&mut ring, step, &mut grads, 4096).map_err(|e| e.to_string())?;
                barriers[0].wait();
                for (round, lost) in rounds.iter().enumerate() {
                    if lost.contains(&id) {
                        drop(ring);
                        return Err("lost".into());
                    }
                    step += 1;
                    all_reduce_mean(&mut ring, step, &mut data(id, len), 4096).expect_err("a node left");
                    ring.regroup(min_nodes).map_err(|e| e.to_string())?;
                    step += 1;
                    grads = data(id, len);
                    all_reduce_mean(&mut ring, step, &mut grads, 4096).map_err(|e| e.to_string())?;
                    barriers[round + 1].wait();
                }
                let ids = ring.members().iter().map(|m| m.id).collect();
                ring.shutdown();
                Ok((ids, grads))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("thread")).collect()
}

/// Every survivor in `results` ends in the ring of `ids` with the mean of their data.
fn assert_regrouped(results: &[Outcome], ids: &[usize]) {
    for &id in ids {
        let (members, grads) = results[id].as_ref().unwrap_or_else(|e| panic!("rank {id}: {e}"));
        assert_eq!(members, ids, "rank {id}'s ring");
        for i in (0..grads.len()).step_by(499) {
            let mean = ids.iter().map(|&r| data(r, grads.len())[i]).sum::<f32>() / ids.len() as f32;
            assert!((grads[i] - mean).abs() < 1e-5, "rank {id}, element {i}: {} against {mean}", grads[i]);
        }
    }
}

#[test]
fn survivors_of_a_lost_middle_rank_form_a_ring_of_three() {
    let results = lose_and_regroup(4, &[&[2]], 2);
    assert_regrouped(&results, &[0, 1, 3]);
}

#[test]
fn survivors_of_a_lost_rank_0_form_a_ring_without_it() {
    let results = lose_and_regroup(4, &[&[0]], 2);
    assert_regrouped(&results, &[1, 2, 3]);
}

#[test]
fn two_losses_in_a_row_leave_a_ring_of_two() {
    let results = lose_and_regroup(4, &[&[1], &[3]], 2);
    assert_regrouped(&results, &[0, 2]);
}

#[test]
fn half_a_ring_stops_so_that_a_split_cannot_go_on_twice() {
    let results = lose_and_regroup(4, &[&[2, 3]], 1);
    for id in [0, 1] {
        let err = results[id].as_ref().expect_err("half of the ring must stop");
        assert!(err.contains("not more than half"), "rank {id}: {err}");
    }
}

#[test]
fn fewer_than_min_nodes_stop_naming_it() {
    let results = lose_and_regroup(3, &[&[1]], 3);
    for id in [0, 2] {
        let err = results[id].as_ref().expect_err("below --min-nodes");
        assert!(err.contains("fewer than the minimum of 3"), "rank {id}: {err}");
    }
}

#[test]
fn requests_to_join_that_cannot_be_taken_in_are_refused_with_the_reason() {
    // A ring launched with 3 nodes loses node 2 and goes on as 0 and 1; then four nodes ask to
    // join it, each in a way the ring must refuse.
    let world = 3;
    let certs = generate(world + 1).expect("certs");
    let ports = free_ports(world + 4);
    let ring_ports = ports[..world].to_vec();
    // Node 2 leaves once every member has the first result; 0 and 1 regroup, then the test asks.
    let first_done = std::sync::Arc::new(std::sync::Barrier::new(world));
    let regrouped = std::sync::Arc::new(std::sync::Barrier::new(3));
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let members: Vec<_> = (0..world)
        .map(|id| {
            let o = options(&certs, id, world, &ring_ports, list(&ring_ports), Duration::from_secs(20));
            let (first_done, regrouped, asked) = (first_done.clone(), regrouped.clone(), asked.clone());
            std::thread::spawn(move || -> Result<Vec<usize>, String> {
                let mut ring = QuicRing::join(o).map_err(|e| e.to_string())?;
                all_reduce_mean(&mut ring, 1, &mut data(id, 1000), 256).map_err(|e| e.to_string())?;
                first_done.wait();
                if id == 2 {
                    drop(ring);
                    return Ok(Vec::new());
                }
                all_reduce_mean(&mut ring, 2, &mut data(id, 1000), 256).expect_err("node 2 left");
                ring.regroup(2).map_err(|e| e.to_string())?;
                regrouped.wait();
                let until = Instant::now() + Duration::from_secs(30);
                while !asked.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < until {
                    assert_eq!(ring.joiners_waiting(), 0, "no request here may be taken in");
                    std::thread::sleep(Duration::from_millis(20));
                }
                let ids = ring.members().iter().map(|m| m.id).collect();
                ring.shutdown();
                Ok(ids)
            })
        })
        .collect();
    regrouped.wait();
    // Each asks as `id` with `identity`'s certificate and `layout`, from a port of its own (a node
    // past the launch's world believes in a larger one: its own check passes, the ring's may not).
    let ask = |id: usize, identity: usize, layout: [u8; 32], port: u16| {
        let mut o = options(&certs, 0, world, &ring_ports, list(&ring_ports), Duration::from_secs(20));
        o.rank = id;
        o.world = world.max(id + 1);
        o.identity = certs.identity(identity).expect("identity");
        o.layout = layout;
        o.listen = SocketAddr::from(([127, 0, 0, 1], port));
        std::thread::spawn(move || QuicRing::join_running(o).map(|_| ()).expect_err("refused").to_string())
    };
    let requests = [
        (ask(1, 1, [7; 32], ports[world]), "node 1 is in the ring already"),
        (ask(3, 3, [7; 32], ports[world + 1]), "node 3 is past the 3 nodes the job was launched with"),
        (ask(2, 2, [8; 32], ports[world + 2]), "it trains another model"),
        (ask(2, 3, [7; 32], ports[world + 3]), "asked to join as node 2 with another node's certificate"),
    ];
    for (request, reason) in requests {
        let err = request.join().expect("joiner");
        assert!(err.contains("refused this node") && err.contains(reason), "{err}\nexpected: {reason}");
    }
    asked.store(true, std::sync::atomic::Ordering::SeqCst);
    let rings: Vec<_> = members.into_iter().map(|m| m.join().expect("member")).collect();
    for id in [0, 1] {
        assert_eq!(rings[id].as_ref().unwrap_or_else(|e| panic!("node {id}: {e}")), &[0, 1], "node {id}'s ring");
    }
}

/// A state sent to one member alone (a node taken in) travels on a connection of its own: that
/// member gets every byte, and the nodes between the two on the ring receive no more than
/// their links' own traffic while it goes (keep-alives, acknowledgements, path probes: 18 KB
/// seen under a loaded `just test`, against the 8 MB a ring would relay through each).
#[test]
fn a_direct_send_reaches_its_member_alone() {
    let world = 4;
    let certs = generate(world).expect("certs");
    let ports = free_ports(world);
    let state: Vec<u8> = (0..8usize << 20).map(|i| (i % 251) as u8).collect();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(world));
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let o = options(&certs, rank, world, &ports, list(&ports), Duration::from_secs(20));
            let (barrier, state) = (barrier.clone(), state.clone());
            std::thread::spawn(move || {
                let mut ring = QuicRing::join(o).expect("join");
                all_reduce_mean(&mut ring, 1, &mut data(rank, 1000), 4096).expect("all-reduce");
                barrier.wait();
                let before = ring.stats();
                let got = match rank {
                    0 => {
                        ring.send_direct(2, bytes::Bytes::from(state)).expect("sent");
                        None
                    }
                    2 => Some(ring.recv_direct().expect("received")),
                    _ => None,
                };
                barrier.wait();
                let received = ring.stats().since(&before).bytes_received;
                ring.shutdown();
                (got, received)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("rank")).collect();
    let (from, bytes) = results[2].0.clone().expect("node 2 got the state");
    assert_eq!(from, 0);
    assert!(bytes.as_ref() == state.as_slice(), "{} bytes arrived of {}", bytes.len(), state.len());
    for rank in [1, 3] {
        assert!(results[rank].1 < 64 << 10, "rank {rank} received {} bytes during the send", results[rank].1);
    }
}
