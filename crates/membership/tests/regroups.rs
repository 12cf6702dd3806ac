//! Whole regroups in virtual time, without sockets: every live node runs the membership core as
//! the QUIC shell drives it (it asks the lowest member below it that it reaches and that
//! coordinates, else coordinates itself; a coordinator decides when it waits for no one, or when
//! time is up), over a network where nodes die and sides split. The survivors of any one loss go
//! on together, two losses in a row too, both halves of an even split stop, the larger side of
//! an uneven one goes on, and a join racing a loss is taken in.

use std::collections::{BTreeMap, BTreeSet};

use ringtune_membership::{Candidate, Member, Membership, NodeId, Refusal};

/// When a coordinator still waiting gives up on the rest (virtual seconds: the peer timeout).
const TIME_UP: u64 = 4;

const SETTINGS: [u8; 32] = [7; 32];

fn candidate(id: NodeId) -> Candidate {
    Candidate { id, certified: true, settings: SETTINGS }
}

/// Each live node's outcome of one regroup, and when it was decided.
type Outcomes = BTreeMap<NodeId, (Result<Vec<NodeId>, Refusal>, u64)>;

struct Cluster {
    nodes: BTreeMap<NodeId, Membership<()>>,
    dead: BTreeSet<NodeId>,
    /// Which side of a split each node is on (all on side 0 until one).
    side: BTreeMap<NodeId, usize>,
    min_nodes: usize,
}

impl Cluster {
    fn launch(world: usize, min_nodes: usize) -> Self {
        let ring: Vec<Member<()>> = (0..world).map(|id| Member { id, addr: () }).collect();
        let nodes = (0..world)
            .map(|rank| (rank, Membership::new(ring.clone(), rank, world, SETTINGS).expect("rank")))
            .collect();
        Cluster { nodes, dead: BTreeSet::new(), side: (0..world).map(|id| (id, 0)).collect(), min_nodes }
    }

    fn reaches(&self, a: NodeId, b: NodeId) -> bool {
        !self.dead.contains(&b) && self.side.get(&a) == self.side.get(&b)
    }

    fn alive(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().filter(|id| !self.dead.contains(id)).collect()
    }

    /// Each live node's ring neighbours it no longer reaches go silent: it finds them lost.
    fn links_go_silent(&mut self) {
        for id in self.alive() {
            let node = &self.nodes[&id];
            let silent: Vec<NodeId> =
                [node.neighbour(-1).id, node.neighbour(1).id].into_iter().filter(|&n| !self.reaches(id, n)).collect();
            let node = self.nodes.get_mut(&id).expect("node");
            silent.into_iter().for_each(|n| node.peer_lost(n));
        }
    }

    fn kill(&mut self, ids: &[NodeId]) {
        self.dead.extend(ids);
        self.links_go_silent();
    }

    fn split(&mut self, sides: &[&[NodeId]]) {
        for (side, ids) in sides.iter().enumerate() {
            ids.iter().for_each(|id| _ = self.side.insert(*id, side));
        }
        self.links_go_silent();
    }

    /// Node `id` (a replacement, or one never started) asks member `via` to join.
    fn ask_to_join(&mut self, id: NodeId, via: NodeId) -> Result<(), Refusal> {
        self.nodes.get_mut(&via).expect("via").join_request(&candidate(id), ())
    }

    /// One regroup of every live node; the nodes taken in get their place.
    fn regroup(&mut self) -> Outcomes {
        let mut coordinator: BTreeMap<NodeId, NodeId> = BTreeMap::new();
        for id in self.alive() {
            let asked = self.nodes[&id]
                .coordinators()
                .iter()
                .map(|m| m.id)
                .find(|&c| self.reaches(id, c) && coordinator.get(&c) == Some(&c));
            coordinator.insert(id, asked.unwrap_or(id));
        }
        let mut outcomes = Outcomes::new();
        for (&lead, _) in coordinator.iter().filter(|(id, c)| id == c) {
            let mut gathering = self.nodes[&lead].gathering(self.min_nodes);
            let group: Vec<NodeId> = coordinator.iter().filter(|(_, c)| **c == lead).map(|(id, _)| *id).collect();
            for &id in group.iter().filter(|&&id| id != lead) {
                let node = &self.nodes[&id];
                gathering.survivor(&candidate(id), node.lost(), node.joiners().to_vec()).expect("a survivor");
            }
            let at = if gathering.waiting() { TIME_UP } else { 0 };
            let decided = gathering.decide();
            for &id in &group {
                outcomes.insert(id, (decided.clone().map(|ms| ms.iter().map(|m| m.id).collect()), at));
            }
            if let Ok(members) = decided {
                for member in &members {
                    let taken_in = !group.contains(&member.id);
                    if taken_in {
                        let rank = members.iter().position(|m| m.id == member.id).expect("in it");
                        let node = Membership::new(members.clone(), rank, self.nodes[&lead].launch_world(), SETTINGS);
                        self.nodes.insert(member.id, node.expect("rank"));
                        self.dead.remove(&member.id);
                        self.side.insert(member.id, self.side[&lead]);
                    } else {
                        self.nodes.get_mut(&member.id).expect("member").form(members.clone()).expect("in the ring");
                    }
                }
            }
        }
        outcomes
    }
}

/// Every outcome the same ring, decided without waiting out the time.
fn one_ring(outcomes: &Outcomes) -> Vec<NodeId> {
    let rings: BTreeSet<_> = outcomes.values().map(|(o, _)| o.clone().expect("the survivors go on")).collect();
    assert_eq!(rings.len(), 1, "the survivors agree: {outcomes:?}");
    assert!(outcomes.values().all(|(_, at)| *at == 0), "no wait for a node a survivor knows lost: {outcomes:?}");
    rings.into_iter().next().expect("one")
}

#[test]
fn the_survivors_of_any_one_loss_form_one_ring_at_once() {
    for world in 3..=7 {
        for victim in 0..world {
            let mut cluster = Cluster::launch(world, 2);
            cluster.kill(&[victim]);
            let ring = one_ring(&cluster.regroup());
            let expected: Vec<NodeId> = (0..world).filter(|&id| id != victim).collect();
            assert_eq!(ring, expected, "world {world} without {victim}");
            for (rank, id) in expected.iter().enumerate() {
                let node = &cluster.nodes[id];
                assert_eq!((node.rank(), node.world(), node.lost().len()), (rank, world - 1, 0), "node {id}");
            }
        }
    }
}

#[test]
fn two_nodes_lost_at_once_or_in_a_row() {
    for world in 3..=7 {
        for a in 0..world {
            for b in a + 1..world {
                let mut cluster = Cluster::launch(world, 2);
                cluster.kill(&[a, b]);
                let outcomes = cluster.regroup();
                if 2 * (world - 2) > world {
                    let expected: Vec<NodeId> = (0..world).filter(|&id| id != a && id != b).collect();
                    for (id, (outcome, _)) in &outcomes {
                        assert_eq!(outcome, &Ok(expected.clone()), "world {world} without {a} and {b}: node {id}");
                    }
                } else {
                    assert!(
                        outcomes.values().all(|(o, _)| matches!(o, Err(Refusal::Minority { .. }))),
                        "world {world} without {a} and {b}: {outcomes:?}"
                    );
                }
            }
        }
    }
    // In a row: 5 nodes lose 1, then 3, then 0; the last two lose one more and stop.
    let mut cluster = Cluster::launch(5, 2);
    for (victim, left) in [(1, vec![0, 2, 3, 4]), (3, vec![0, 2, 4]), (0, vec![2, 4])] {
        cluster.kill(&[victim]);
        assert_eq!(one_ring(&cluster.regroup()), left);
    }
    cluster.kill(&[2]);
    let outcomes = cluster.regroup();
    assert_eq!(outcomes[&4].0, Err(Refusal::Minority { together: 1, before: 2 }));
}

#[test]
fn an_even_split_stops_both_halves_and_an_uneven_one_the_smaller_side() {
    let mut cluster = Cluster::launch(4, 2);
    cluster.split(&[&[0, 1], &[2, 3]]);
    let outcomes = cluster.regroup();
    assert_eq!(outcomes.len(), 4);
    for (id, (outcome, _)) in &outcomes {
        assert_eq!(outcome, &Err(Refusal::Minority { together: 2, before: 4 }), "node {id}");
    }
    let mut cluster = Cluster::launch(5, 2);
    cluster.split(&[&[0, 1], &[2, 3, 4]]);
    let outcomes = cluster.regroup();
    for id in [0, 1] {
        assert_eq!(outcomes[&id].0, Err(Refusal::Minority { together: 2, before: 5 }), "node {id}");
    }
    for id in [2, 3, 4] {
        assert_eq!(outcomes[&id].0, Ok(vec![2, 3, 4]), "node {id}");
    }
    // A node cut off alone, whose lower members are neither reached nor all known lost,
    // coordinates itself, waits until time is up, and stops.
    let mut cluster = Cluster::launch(4, 2);
    cluster.split(&[&[0, 1, 2], &[3]]);
    let outcomes = cluster.regroup();
    assert_eq!(outcomes[&3], (Err(Refusal::Minority { together: 1, before: 4 }), TIME_UP));
    assert_eq!(outcomes[&0].0, Ok(vec![0, 1, 2]));
}

#[test]
fn fewer_nodes_than_the_minimum_stop() {
    let mut cluster = Cluster::launch(4, 4);
    cluster.kill(&[0]);
    for (id, (outcome, _)) in cluster.regroup() {
        assert_eq!(outcome, Err(Refusal::TooFew { nodes: 3, min_nodes: 4 }), "node {id}");
    }
}

#[test]
fn a_join_racing_a_loss_is_taken_in() {
    let mut cluster = Cluster::launch(4, 2);
    cluster.kill(&[3]);
    assert_eq!(one_ring(&cluster.regroup()), [0, 1, 2]);
    // A replacement for node 3 asks node 2 while node 1 is lost: one regroup does both.
    cluster.ask_to_join(3, 2).expect("a replacement for node 3");
    assert_eq!(cluster.ask_to_join(1, 2), Err(Refusal::Taken { id: 1 }), "node 1 is still a member for node 2");
    cluster.kill(&[1]);
    assert_eq!(one_ring(&cluster.regroup()), [0, 2, 3]);
    assert_eq!((cluster.nodes[&3].rank(), cluster.nodes[&3].world()), (2, 3));
    // A join held by a node on the side that stops is not taken in.
    let mut cluster = Cluster::launch(4, 2);
    cluster.kill(&[3]);
    cluster.regroup();
    cluster.ask_to_join(3, 2).expect("asked node 2");
    cluster.kill(&[0, 1]);
    let outcomes = cluster.regroup();
    assert_eq!(outcomes[&2].0, Err(Refusal::Minority { together: 1, before: 3 }));
}
