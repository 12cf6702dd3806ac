//! A sharded optimizer's state across a change of ring. Each dense shard is stepped by its
//! owner and, as a backup, by the next rank (`SyncPlan::shard_backup`); after the ring changes,
//! every member sends what it holds of the last ring's shards (its own, the backup of a
//! predecessor that is gone, and the word-embedding table when a new node needs it), and each
//! puts the whole buffer together from the parts ([`assemble`]), so that it can step its pieces
//! of the new ring from the same state. Pure: the ring's gather lives in `super::ring`.

use std::ops::Range;

use bytes::Bytes;
use ringtune_collective::{BucketKind, SyncPlan};

use super::Nodes;

/// The first lost node whose successor in `old` is lost too: their shard is gone with both.
pub(super) fn lost_with_backup(old: &Nodes, now: &[usize]) -> Option<(usize, usize)> {
    let world = old.members.len();
    (0..world)
        .map(|r| (old.members[r], old.members[(r + 1) % world]))
        .find(|(id, next)| world > 1 && !now.contains(id) && !now.contains(next))
}

/// The pieces of `plan` (the last ring's) that `old.rank` holds for the ring of members `now`:
/// its own dense shard, and its backup when the shard's owner is not in `now`.
pub(super) fn held_pieces(old: &Nodes, plan: &SyncPlan, now: &[usize]) -> Vec<Range<usize>> {
    let world = old.members.len();
    let mut held = plan.dense_owned_by(old.rank);
    let before = old.members[(old.rank + world - 1) % world];
    if world > 1 && !now.contains(&before) {
        held.extend(plan.shard_backup(old.rank));
    }
    held
}

/// One member's part: the optimizer's step count, then `pieces` with their parameters (when
/// `params` is given) and both moments, read from buffers as long as the parameters.
pub(super) fn encode(step: u64, pieces: &[Range<usize>], params: Option<&[f32]>, m: &[f32], v: &[f32]) -> Bytes {
    let floats: usize = pieces.iter().map(Range::len).sum();
    let mut out = Vec::with_capacity(13 + pieces.len() * 16 + floats * 12);
    out.extend_from_slice(&step.to_le_bytes());
    out.push(u8::from(params.is_some()));
    out.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for piece in pieces {
        out.extend_from_slice(&(piece.start as u64).to_le_bytes());
        out.extend_from_slice(&(piece.end as u64).to_le_bytes());
    }
    for buffer in params.into_iter().chain([m, v]) {
        for piece in pieces {
            out.extend_from_slice(bytemuck::cast_slice(&buffer[piece.clone()]));
        }
    }
    Bytes::from(out)
}

/// Writes every member's part (by rank) into `params`, `m` and `v` (as long as the parameters),
/// and checks that the parts agree on the step and cover every dense bucket of `plan` (and,
/// with `table`, the word-embedding table); returns the step. Errors say which part or floats
/// are wrong.
pub(super) fn assemble(
    parts: &[Bytes],
    plan: &SyncPlan,
    table: bool,
    params: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
) -> Result<u64, String> {
    let len = params.len();
    let mut step = None;
    let mut covered: Vec<Range<usize>> = Vec::new();
    for (rank, part) in parts.iter().enumerate() {
        let bad = |what: &str| format!("rank {rank}'s part of the optimizer state {what}");
        let (at, header) = header(part).ok_or_else(|| bad("is cut short"))?;
        let Header { step: theirs, with_params, pieces } = header;
        if pieces.iter().any(|p| p.start > p.end || p.end > len) {
            return Err(bad(&format!("holds a piece outside the {len} parameters")));
        }
        let floats: usize = pieces.iter().map(Range::len).sum();
        let buffers = if with_params { 3 } else { 2 };
        if part.len() != at + floats * 4 * buffers {
            return Err(bad(&format!("has {} bytes for {floats} floats", part.len())));
        }
        if pieces.is_empty() {
            continue;
        }
        match step {
            Some(s) if s != theirs => {
                return Err(format!("the members are a step apart: optimizer step {s} on one, {theirs} on rank {rank}"))
            }
            _ => step = Some(theirs),
        }
        let targets: Vec<&mut [f32]> =
            if with_params { vec![&mut *params, &mut *m, &mut *v] } else { vec![&mut *m, &mut *v] };
        let mut at = at;
        for target in targets {
            for piece in &pieces {
                // The target's bytes, not the part's floats: a part need not be aligned.
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut target[piece.clone()]);
                bytes.copy_from_slice(&part[at..at + bytes.len()]);
                at += bytes.len();
            }
        }
        covered.extend(pieces);
    }
    let needed = plan.buckets.iter().filter(|b| table || b.kind == BucketKind::Dense).map(|b| b.range.clone());
    if let Some(missing) = needed.flat_map(|r| uncovered(&covered, r)).next() {
        return Err(format!("no member holds floats {missing:?} of the optimizer state"));
    }
    step.ok_or_else(|| "no member holds any of the optimizer state".into())
}

/// What a part says before its floats.
struct Header {
    step: u64,
    with_params: bool,
    pieces: Vec<Range<usize>>,
}

/// A part's header and where its floats start, unless the part is too short.
fn header(part: &[u8]) -> Option<(usize, Header)> {
    let u64_at = |at: usize| part.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    let step = u64_at(0)?;
    let with_params = *part.get(8)? == 1;
    let count = u32::from_le_bytes(part.get(9..13)?.try_into().ok()?) as usize;
    let mut pieces = Vec::with_capacity(count.min(part.len() / 16));
    for i in 0..count {
        let at = 13 + i * 16;
        pieces.push(u64_at(at)? as usize..u64_at(at + 8)? as usize);
    }
    Some((13 + count * 16, Header { step, with_params, pieces }))
}

/// The parts of `range` that no piece of `covered` holds.
fn uncovered(covered: &[Range<usize>], range: Range<usize>) -> Vec<Range<usize>> {
    let mut inside: Vec<Range<usize>> = covered
        .iter()
        .filter(|p| p.start < range.end && range.start < p.end)
        .map(|p| p.start.max(range.start)..p.end.min(range.end))
        .collect();
    inside.sort_by_key(|p| p.start);
    let mut missing = Vec::new();
    let mut at = range.start;
    for piece in inside {
        if piece.start > at {
            missing.push(at..piece.start);
        }
        at = at.max(piece.end);
    }
    if at < range.end {
        missing.push(at..range.end);
    }
    missing
}

#[cfg(test)]
mod tests {
    use ringtune_collective::BucketSizes;

    use super::*;

    /// A table of 10 rows of 4, then 60 dense floats, over buckets of 16.
    fn plan(world: usize) -> SyncPlan {
        let sizes = BucketSizes { first: 16, size: 16, last: 16, align: 4 };
        SyncPlan::new(&[0..40, 40..100], 100, Some((0, 4)), world, sizes)
    }

    fn nodes(members: &[usize], rank: usize) -> Nodes {
        Nodes { members: members.to_vec(), rank, launch_world: 4, min_nodes: 2 }
    }

    /// The state every rank of a ring of four holds, as a run would leave it: parameter `i` is
    /// `i`, its moments `i + 1000` and `i + 2000`.
    fn state() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let p: Vec<f32> = (0..100).map(|i| i as f32).collect();
        (p.clone(), p.iter().map(|x| x + 1000.0).collect(), p.iter().map(|x| x + 2000.0).collect())
    }

    /// Each survivor of `[0, 1, 2, 3]` in `now`: its part, its parameters cut where others own.
    fn parts(now: &[usize], step: u64, with_params: bool) -> Vec<Bytes> {
        let (p, m, v) = state();
        let old = plan(4);
        now.iter()
            .map(|&id| {
                let held = held_pieces(&nodes(&[0, 1, 2, 3], id), &old, now);
                encode(step, &held, with_params.then_some(&p[..]), &m, &v)
            })
            .collect()
    }

    #[test]
    fn survivors_of_any_single_loss_put_the_whole_state_together() {
        let (p, m, v) = state();
        for lost in 0..4 {
            let now: Vec<usize> = (0..4).filter(|&id| id != lost).collect();
            assert_eq!(lost_with_backup(&nodes(&[0, 1, 2, 3], 0), &now), None);
            let (mut p2, mut m2, mut v2) = (vec![-1.0; 100], vec![-1.0; 100], vec![-1.0; 100]);
            // The table is every member's: already in place.
            p2[..40].copy_from_slice(&p[..40]);
            m2[..40].copy_from_slice(&m[..40]);
            v2[..40].copy_from_slice(&v[..40]);
            let step = assemble(&parts(&now, 7, true), &plan(3), false, &mut p2, &mut m2, &mut v2).expect("whole");
            assert_eq!(step, 7);
            assert_eq!((p2, m2, v2), (p.clone(), m.clone(), v.clone()), "rank {lost} lost");
        }
    }

    #[test]
    fn neighbours_lost_together_take_a_shard_with_them_and_are_named() {
        let old = nodes(&[0, 1, 2, 3], 0);
        assert_eq!(lost_with_backup(&old, &[0, 3]), Some((1, 2)));
        assert_eq!(lost_with_backup(&old, &[1, 2]), Some((3, 0)));
        assert_eq!(lost_with_backup(&old, &[0, 2]), None, "every other node: each backup lives");
        let (mut p, mut m, mut v) = state();
        let error = assemble(&parts(&[0, 3], 7, true), &plan(2), false, &mut p, &mut m, &mut v).expect_err("a gap");
        assert!(error.contains("no member holds floats"), "{error}");
    }

    #[test]
    fn parts_a_step_apart_or_malformed_are_refused_by_rank() {
        let (mut p, mut m, mut v) = state();
        let mut mixed = parts(&[0, 1, 2], 7, false);
        mixed[2] = parts(&[0, 1, 2], 8, false)[2].clone();
        let error = assemble(&mixed, &plan(3), false, &mut p, &mut m, &mut v).expect_err("a step apart");
        assert!(error.contains("a step apart") && error.contains("rank 2"), "{error}");
        let mut cut = parts(&[0, 1, 2], 7, false);
        cut[1] = cut[1].slice(..cut[1].len() - 4);
        let error = assemble(&cut, &plan(3), false, &mut p, &mut m, &mut v).expect_err("short");
        assert!(error.contains("rank 1's part"), "{error}");
        let beyond: Vec<Range<usize>> = std::iter::once(90..120).collect();
        let outside = encode(7, &beyond, None, &[0.0; 120], &[0.0; 120]);
        let error = assemble(&[outside], &plan(3), false, &mut p, &mut m, &mut v).expect_err("outside");
        assert!(error.contains("outside the 100 parameters"), "{error}");
    }

    #[test]
    fn a_new_node_needs_the_table_from_someone() {
        let (p, m, v) = state();
        let old = plan(4);
        let mut parts: Vec<Bytes> = (0..4)
            .map(|id| encode(3, &held_pieces(&nodes(&[0, 1, 2, 3], id), &old, &[0, 1, 2, 3, 4]), None, &m, &v))
            .collect();
        parts.push(encode(0, &[], None, &[], &[]));
        let (mut p2, mut m2, mut v2) = (p.clone(), vec![0.0; 100], vec![0.0; 100]);
        let error = assemble(&parts, &plan(5), true, &mut p2, &mut m2, &mut v2).expect_err("no table");
        assert!(error.contains("0..40"), "{error}");
        let mut with_table = old.dense_owned_by(0);
        with_table.push(0..40);
        parts[0] = encode(3, &with_table, None, &m, &v);
        let step = assemble(&parts, &plan(5), true, &mut p2, &mut m2, &mut v2).expect("whole");
        assert_eq!((step, m2, v2), (3, m, v), "the new node's part is empty and its step not counted");
    }
}
