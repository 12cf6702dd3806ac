//! A ring of four loses node 2: the survivors register with node 0, which decides the next
//! ring; a replacement for node 2 then asks node 3 to join and is taken in at the next regroup.

use ringtune_membership::{Candidate, Member, Membership};

fn main() {
    let settings = [0; 32];
    let candidate = |id| Candidate { id, certified: true, settings };
    let ring: Vec<Member<String>> = (0..4).map(|id| Member { id, addr: format!("node-{id}:29500") }).collect();
    let mut nodes: Vec<Membership<String>> =
        (0..4).map(|rank| Membership::new(ring.clone(), rank, 4, settings).expect("rank")).collect();
    // Node 2's neighbours find its links silent.
    nodes[1].peer_lost(2);
    nodes[3].peer_lost(2);
    let mut gathering = nodes[0].gathering(2);
    for id in [1, 3] {
        gathering.survivor(&candidate(id), nodes[id].lost(), nodes[id].joiners().to_vec()).expect("a survivor");
    }
    println!("waiting for anyone else: {}", gathering.waiting());
    let next = gathering.decide().expect("three of four go on");
    for id in [0, 1, 3] {
        nodes[id].form(next.clone()).expect("in the ring");
    }
    println!("next ring: {:?}", nodes[0].ids());
    nodes[3].join_request(&candidate(2), "node-2b:29500".into()).expect("a replacement for node 2");
    let refused = nodes[3].join_request(&candidate(1), "elsewhere:29500".into()).expect_err("node 1 is a member");
    println!("a second node 1 is refused: {refused}");
    let mut gathering = nodes[0].gathering(2);
    for id in [1, 3] {
        gathering.survivor(&candidate(id), nodes[id].lost(), nodes[id].joiners().to_vec()).expect("a survivor");
    }
    let grown = gathering.decide().expect("the replacement is taken in");
    println!("grown ring: {:?}", grown.iter().map(|m| (m.id, m.addr.as_str())).collect::<Vec<_>>());
}
