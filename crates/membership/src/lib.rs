//! Who is in a ring of training nodes, and who may come in: a core without I/O, as
//! `quinn-proto` is to `quinn` and `ringtune-collective`'s ring is to its transport. Events go in
//! (a launch's registration, a survivor's or a joiner's request, a peer lost, time up, a ring
//! formed); decisions come out (the members in rank order, or a typed [`Refusal`]).
//!
//! Owns: one admission check for every way in (a launch, a regroup, a join); the rule by which
//! the survivors of a ring go on (more than half of the last ring, and at least the run's
//! minimum); the new ring's order (by id, the rank each node was launched with); who a regroup's
//! coordinator still waits for; and one value a node's layers read it from ([`Membership`]).
//!
//! Does not own: messages, sockets or certificates (`ringtune-quic` carries the requests and
//! tells whether a certificate names the node), clocks (the shell says when time is up), what the
//! settings are (the trainer hashes them), nor what a node does with the ring (training).
//!
//! ```
//! use ringtune_membership::{Candidate, Member, Membership};
//! // Four nodes lose node 2; node 0, the lowest member the survivors reach, coordinates.
//! let ring: Vec<Member<()>> = (0..4).map(|id| Member { id, addr: () }).collect();
//! let mut zero = Membership::new(ring, 0, 4, [0; 32]).unwrap();
//! zero.peer_lost(2);
//! let mut gathering = zero.gathering(2);
//! for id in [1, 3] {
//!     gathering.survivor(&Candidate { id, certified: true, settings: [0; 32] }, &[], Vec::new()).unwrap();
//! }
//! assert!(!gathering.waiting());
//! let next = gathering.decide().unwrap();
//! assert_eq!(next.iter().map(|m| m.id).collect::<Vec<_>>(), [0, 1, 3]);
//! zero.form(next).unwrap();
//! assert_eq!((zero.rank(), zero.world()), (0, 3));
//! ```

/// A node's id: the rank it was launched with, the one its certificate names.
pub type NodeId = usize;

/// What every node of a ring must train alike, as one hash (the parameter layout and the
/// settings the trainer folds in).
pub type Settings = [u8; 32];

/// A node of a ring: its id and where it is reached (an address to the shell, anything to tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<A> {
    /// The id its certificate names.
    pub id: NodeId,
    /// Where it is reached.
    pub addr: A,
}

/// The way a node asks for a place, which a refusal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asking {
    /// A launch's registration with the coordinator.
    Launch,
    /// A survivor's registration in a regroup.
    Regroup,
    /// A request to join a running ring.
    Join,
}

impl std::fmt::Display for Asking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Asking::Launch => "registered as rank",
            Asking::Regroup => "came to the regroup as node",
            Asking::Join => "asked to join as node",
        })
    }
}

/// A node asking for a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The id it asks as.
    pub id: NodeId,
    /// Its certificate names that id (the shell checked it).
    pub certified: bool,
    /// What it trains.
    pub settings: Settings,
}

/// Why a node is not taken in, or a ring not formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The nodes together are half of the last ring or fewer: the other side of a split may go
    /// on, so this one stops.
    #[error(
        "only {together} of the {before} nodes of the last ring are together: not more than half, so this side stops \
         (the other may go on)"
    )]
    Minority {
        /// Members of the last ring together now.
        together: usize,
        /// Members of the last ring.
        before: usize,
    },
    /// Fewer nodes than the run's minimum would go on.
    #[error("{nodes} nodes are left, fewer than the minimum of {min_nodes}")]
    TooFew {
        /// Nodes the ring would have.
        nodes: usize,
        /// The fewest it may have.
        min_nodes: usize,
    },
    /// The id belongs to a node in the ring (or, at a launch, registered already).
    #[error("node {id} is in the ring already")]
    Taken {
        /// The id asked for.
        id: NodeId,
    },
    /// The id is not one of the launch's ranks.
    #[error("node {id} is past the {world} nodes the job was launched with")]
    PastTheWorld {
        /// The id asked for.
        id: NodeId,
        /// Nodes at launch.
        world: usize,
    },
    /// The node counts another world at launch.
    #[error("node {id} thinks the world has {theirs} nodes, the coordinator {ours}")]
    WorldDiffers {
        /// The id asked for.
        id: NodeId,
        /// Its world.
        theirs: usize,
        /// The coordinator's.
        ours: usize,
    },
    /// The node trains another layout, or with other settings every node must share.
    #[error("node {id}: it trains another model, with another parameter layout or settings every node must share")]
    SettingsDiffer {
        /// The id asked for.
        id: NodeId,
    },
    /// Its certificate names another node.
    #[error("{asking} {id} with another node's certificate")]
    NotCertified {
        /// How it asked.
        asking: Asking,
        /// The id it asked as.
        id: NodeId,
    },
    /// A regroup's registration from a node that was not in the last ring.
    #[error("node {id} is not a member of the last ring")]
    NotAMember {
        /// The id it asked as.
        id: NodeId,
    },
    /// The node registered twice in one regroup.
    #[error("node {id} registered twice")]
    Twice {
        /// The id it asked as.
        id: NodeId,
    },
    /// The ring formed without this node.
    #[error("the ring formed without node {id}")]
    LeftOut {
        /// This node's id.
        id: NodeId,
    },
}

/// The one admission check, for every way of asking: the certificate names the id asked for,
/// the seat is open (`seat`: why not, when not), and the node trains what this ring trains.
fn admit(candidate: &Candidate, asking: Asking, settings: &Settings, seat: Result<(), Refusal>) -> Result<(), Refusal> {
    let id = candidate.id;
    if !candidate.certified {
        return Err(Refusal::NotCertified { asking, id });
    }
    seat?;
    if candidate.settings != *settings {
        return Err(Refusal::SettingsDiffer { id });
    }
    Ok(())
}

/// Why `together` of the `before` nodes of the last ring, `nodes` with those taken in, may not go
/// on: half of a split or less, or fewer than `min_nodes`.
fn may_go_on(together: usize, before: usize, nodes: usize, min_nodes: usize) -> Result<(), Refusal> {
    if 2 * together <= before {
        Err(Refusal::Minority { together, before })
    } else if nodes < min_nodes {
        Err(Refusal::TooFew { nodes, min_nodes })
    } else {
        Ok(())
    }
}

/// A launch, as its coordinator (rank 0) sees it: every rank registers once. The first refusal
/// refuses the job (every node hears it); a refused registration still fills the seat it names
/// when that seat was open, so the wait ends and every node hears why.
#[derive(Debug, Clone)]
pub struct Launch<A> {
    settings: Settings,
    seats: Vec<Option<A>>,
    problem: Option<Refusal>,
}

impl<A: Clone> Launch<A> {
    /// A launch of `world` nodes training `settings`, its coordinator (rank 0) at `addr`.
    pub fn new(world: usize, settings: Settings, addr: A) -> Self {
        let mut seats = vec![None; world.max(1)];
        seats[0] = Some(addr);
        Launch { settings, seats, problem: None }
    }

    /// Rank `candidate.id`'s registration, reached at `addr`, from a node that counts `world`
    /// nodes.
    pub fn register(&mut self, candidate: &Candidate, world: usize, addr: A) -> Result<(), Refusal> {
        let (id, ours) = (candidate.id, self.seats.len());
        let open = self.seats.get(id).is_some_and(Option::is_none);
        let seat = match () {
            _ if world != ours => Err(Refusal::WorldDiffers { id, theirs: world, ours }),
            _ if open => Ok(()),
            _ if id >= ours => Err(Refusal::PastTheWorld { id, world: ours }),
            _ => Err(Refusal::Taken { id }),
        };
        let verdict = admit(candidate, Asking::Launch, &self.settings, seat);
        if open {
            self.seats[id] = Some(addr);
        }
        if let Err(refusal) = &verdict {
            self.problem.get_or_insert_with(|| refusal.clone());
        }
        verdict
    }

    /// Every seat is filled: the launch is decided.
    pub fn complete(&self) -> bool {
        self.seats.iter().all(Option::is_some)
    }

    /// Once complete: every rank's address in rank order, or the first refusal.
    pub fn decide(&self) -> Result<Vec<A>, Refusal> {
        match &self.problem {
            Some(refusal) => Err(refusal.clone()),
            None => Ok(self.seats.iter().flatten().cloned().collect()),
        }
    }
}

/// A node's view of its ring: the members in rank order, its own place, the launch's world,
/// the members it knows lost and the nodes that asked it to join, until the next ring forms.
#[derive(Debug, Clone)]
pub struct Membership<A> {
    members: Vec<Member<A>>,
    rank: usize,
    launch_world: usize,
    settings: Settings,
    lost: Vec<NodeId>,
    joiners: Vec<Member<A>>,
}

impl<A: Clone> Membership<A> {
    /// Member `rank` of `members` (in rank order), in a job of `launch_world` nodes training
    /// `settings`; `None` when there is no such rank.
    pub fn new(members: Vec<Member<A>>, rank: usize, launch_world: usize, settings: Settings) -> Option<Self> {
        (rank < members.len()).then_some(Membership {
            members,
            rank,
            launch_world,
            settings,
            lost: Vec::new(),
            joiners: Vec::new(),
        })
    }

    /// The members, in rank order.
    pub fn members(&self) -> &[Member<A>] {
        &self.members
    }

    /// The members' ids, in rank order.
    pub fn ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }

    /// This node's rank in the ring.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Members of the ring.
    pub fn world(&self) -> usize {
        self.members.len()
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.members[self.rank].id
    }

    /// Nodes at launch.
    pub fn launch_world(&self) -> usize {
        self.launch_world
    }

    /// The member `places` ranks after this node's around the ring (before it when negative).
    pub fn neighbour(&self, places: isize) -> &Member<A> {
        let world = self.world() as isize;
        &self.members[(self.rank as isize + places).rem_euclid(world) as usize]
    }

    /// Member `id` is lost (its link went silent, it left, or another member says so); ids of
    /// nodes outside the ring are ignored.
    pub fn peer_lost(&mut self, id: NodeId) {
        if !self.lost.contains(&id) && self.members.iter().any(|m| m.id == id) {
            self.lost.push(id);
        }
    }

    /// The members this node knows lost since the ring formed.
    pub fn lost(&self) -> &[NodeId] {
        &self.lost
    }

    /// A node asks to join, reached at `addr`: taken in at the next regroup, or refused. A
    /// second request of the same id replaces the first.
    pub fn join_request(&mut self, candidate: &Candidate, addr: A) -> Result<(), Refusal> {
        let id = candidate.id;
        let seat = if self.members.iter().any(|m| m.id == id) {
            Err(Refusal::Taken { id })
        } else if id >= self.launch_world {
            Err(Refusal::PastTheWorld { id, world: self.launch_world })
        } else {
            Ok(())
        };
        admit(candidate, Asking::Join, &self.settings, seat)?;
        self.joiners.retain(|j| j.id != id);
        self.joiners.push(Member { id, addr });
        Ok(())
    }

    /// The nodes waiting to join.
    pub fn joiners(&self) -> &[Member<A>] {
        &self.joiners
    }

    /// Whom this node asks to coordinate a regroup, in turn: the members below it that it does
    /// not know lost, lowest first. When it reaches none, it coordinates.
    pub fn coordinators(&self) -> Vec<&Member<A>> {
        let me = self.me();
        let mut lower: Vec<&Member<A>> =
            self.members.iter().filter(|m| m.id < me && !self.lost.contains(&m.id)).collect();
        lower.sort_by_key(|m| m.id);
        lower
    }

    /// This node coordinates a regroup of at least `min_nodes` nodes.
    pub fn gathering(&self, min_nodes: usize) -> Gathering<A> {
        Gathering {
            last: self.members.clone(),
            me: self.me(),
            settings: self.settings,
            min_nodes,
            lost: self.lost.clone(),
            came: Vec::new(),
            joining: self.joiners.clone(),
        }
    }

    /// The next ring formed with `members` (in rank order): this node's place in it; what
    /// it knew lost and the joiners it held are done with.
    pub fn form(&mut self, members: Vec<Member<A>>) -> Result<(), Refusal> {
        let me = self.me();
        self.rank = members.iter().position(|m| m.id == me).ok_or(Refusal::LeftOut { id: me })?;
        self.members = members;
        self.lost.clear();
        self.joiners.clear();
        Ok(())
    }
}

/// A regroup as its coordinator sees it: the survivors of the last ring register (each with
/// the members it knows lost and the nodes that asked it to join); it waits for every member
/// not known lost, or until the shell says time is up, then decides.
#[derive(Debug, Clone)]
pub struct Gathering<A> {
    last: Vec<Member<A>>,
    me: NodeId,
    settings: Settings,
    min_nodes: usize,
    lost: Vec<NodeId>,
    came: Vec<NodeId>,
    joining: Vec<Member<A>>,
}

impl<A: Clone> Gathering<A> {
    /// A survivor's registration, with the members it knows lost and the nodes that asked it to
    /// join (each checked by it when they asked).
    pub fn survivor(&mut self, candidate: &Candidate, lost: &[NodeId], joiners: Vec<Member<A>>) -> Result<(), Refusal> {
        let id = candidate.id;
        let seat = if !self.last.iter().any(|m| m.id == id) {
            Err(Refusal::NotAMember { id })
        } else if id == self.me || self.came.contains(&id) {
            Err(Refusal::Twice { id })
        } else {
            Ok(())
        };
        admit(candidate, Asking::Regroup, &self.settings, seat)?;
        self.came.push(id);
        self.lost.extend(lost.iter().filter(|l| !self.lost.contains(l)).collect::<Vec<_>>());
        self.joining.extend(joiners);
        Ok(())
    }

    /// Some member of the last ring is neither here nor known lost: the coordinator waits on,
    /// until time is up.
    pub fn waiting(&self) -> bool {
        self.last.iter().any(|m| m.id != self.me && !self.lost.contains(&m.id) && !self.came.contains(&m.id))
    }

    /// The next ring (those who came, this node, and the joiners, by id), or why there is none.
    pub fn decide(&self) -> Result<Vec<Member<A>>, Refusal> {
        let mut members: Vec<Member<A>> =
            self.last.iter().filter(|m| m.id == self.me || self.came.contains(&m.id)).cloned().collect();
        let together = members.len();
        for joiner in &self.joining {
            if !members.iter().any(|m| m.id == joiner.id) {
                members.push(joiner.clone());
            }
        }
        members.sort_by_key(|m| m.id);
        may_go_on(together, self.last.len(), members.len(), self.min_nodes)?;
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: NodeId) -> Candidate {
        Candidate { id, certified: true, settings: [1; 32] }
    }

    fn ring(n: usize) -> Vec<Member<u16>> {
        (0..n).map(|id| Member { id, addr: 9000 + id as u16 }).collect()
    }

    #[test]
    fn a_launch_seats_every_rank_once_and_its_first_refusal_refuses_the_job() {
        let mut launch = Launch::new(3, [1; 32], 9000u16);
        assert_eq!(launch.register(&node(2), 3, 9002), Ok(()));
        assert!(!launch.complete());
        assert_eq!(launch.register(&node(2), 3, 9012), Err(Refusal::Taken { id: 2 }));
        assert_eq!(launch.register(&node(0), 3, 9010), Err(Refusal::Taken { id: 0 }));
        assert_eq!(launch.register(&node(5), 3, 9005), Err(Refusal::PastTheWorld { id: 5, world: 3 }));
        assert_eq!(launch.decide(), Err(Refusal::Taken { id: 2 }), "the first refusal");
        let mut clean = Launch::new(3, [1; 32], 9000u16);
        clean.register(&node(1), 3, 9001).expect("rank 1");
        clean.register(&node(2), 3, 9002).expect("rank 2");
        assert!(clean.complete());
        assert_eq!(clean.decide(), Ok(vec![9000, 9001, 9002]));
    }

    #[test]
    fn a_refused_registration_fills_its_open_seat_so_the_wait_ends() {
        let mut launch = Launch::new(2, [1; 32], 0u16);
        let other = Candidate { settings: [2; 32], ..node(1) };
        assert_eq!(launch.register(&other, 2, 1), Err(Refusal::SettingsDiffer { id: 1 }));
        assert!(launch.complete());
        assert_eq!(launch.decide(), Err(Refusal::SettingsDiffer { id: 1 }));
        let mut launch = Launch::new(2, [1; 32], 0u16);
        assert_eq!(launch.register(&node(1), 4, 1), Err(Refusal::WorldDiffers { id: 1, theirs: 4, ours: 2 }));
        assert!(launch.complete());
    }

    #[test]
    fn one_check_admits_a_joiner() {
        let mut m = Membership::new(ring(3), 1, 4, [1; 32]).expect("rank 1");
        let forged = Candidate { certified: false, ..node(3) };
        assert_eq!(m.join_request(&forged, 1), Err(Refusal::NotCertified { asking: Asking::Join, id: 3 }));
        assert_eq!(m.join_request(&node(2), 1), Err(Refusal::Taken { id: 2 }));
        assert_eq!(m.join_request(&node(4), 1), Err(Refusal::PastTheWorld { id: 4, world: 4 }));
        let other = Candidate { settings: [2; 32], ..node(3) };
        assert_eq!(m.join_request(&other, 1), Err(Refusal::SettingsDiffer { id: 3 }));
        assert!(m.joiners().is_empty());
        m.join_request(&node(3), 7).expect("node 3");
        m.join_request(&node(3), 8).expect("asked again");
        assert_eq!(m.joiners(), [Member { id: 3, addr: 8 }]);
        assert_eq!(
            Refusal::NotCertified { asking: Asking::Join, id: 2 }.to_string(),
            "asked to join as node 2 with another node's certificate"
        );
    }

    #[test]
    fn a_survivor_from_outside_the_ring_or_twice_is_refused() {
        let m = Membership::new(ring(4), 0, 4, [1; 32]).expect("rank 0");
        let mut g = m.gathering(2);
        assert_eq!(g.survivor(&node(7), &[], Vec::new()), Err(Refusal::NotAMember { id: 7 }));
        assert_eq!(g.survivor(&node(0), &[], Vec::new()), Err(Refusal::Twice { id: 0 }));
        g.survivor(&node(1), &[], Vec::new()).expect("node 1");
        assert_eq!(g.survivor(&node(1), &[], Vec::new()), Err(Refusal::Twice { id: 1 }));
        assert!(g.waiting(), "nodes 2 and 3 are neither here nor known lost");
        g.survivor(&node(3), &[2], Vec::new()).expect("node 3, which knows 2 lost");
        assert!(!g.waiting());
        assert_eq!(g.decide().map(|ms| ms.iter().map(|m| m.id).collect::<Vec<_>>()), Ok(vec![0, 1, 3]));
    }

    #[test]
    fn the_ring_forms_without_a_node_only_when_it_is_in_it() {
        let mut m = Membership::new(ring(3), 2, 3, [1; 32]).expect("rank 2");
        m.peer_lost(1);
        m.peer_lost(1);
        m.peer_lost(9);
        assert_eq!(m.lost(), [1]);
        assert_eq!(m.coordinators().iter().map(|c| c.id).collect::<Vec<_>>(), [0]);
        let without_me = vec![Member { id: 0, addr: 9000 }, Member { id: 1, addr: 9001 }];
        assert_eq!(m.form(without_me), Err(Refusal::LeftOut { id: 2 }));
        m.form(vec![Member { id: 0, addr: 9000 }, Member { id: 2, addr: 9002 }]).expect("formed");
        assert_eq!((m.rank(), m.world(), m.me(), m.lost().len()), (1, 2, 2, 0));
        assert_eq!(m.neighbour(1).id, 0);
        assert_eq!(m.neighbour(-1).id, 0);
    }
}
