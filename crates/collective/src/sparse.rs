//! Row-sparse averaging for embedding tables.
//!
//! A batch looks up few rows of a word-embedding table (about a thousand of 30,522 for MRPC),
//! and every other row's gradient is exactly zero on that rank. Ranks therefore exchange the
//! rows they used (a gather of sorted row ids, a few KiB), all-reduce only the union of those
//! rows, packed, and write them back: the rows outside the union are zero everywhere, which is
//! already their mean. For all-MiniLM-L6-v2 the table is half of all parameters.

use bytes::Bytes;

use crate::{gather, ring, CollectiveError, RingMode, Transport, Wire};

/// The sorted, distinct rows that `ids` index in a table of `rows` rows.
pub fn used_rows(ids: &[i64], rows: usize) -> Result<Vec<u32>, CollectiveError> {
    let mut used = Vec::with_capacity(ids.len());
    for &id in ids {
        match u32::try_from(id) {
            Ok(row) if (row as usize) < rows => used.push(row),
            _ => return Err(CollectiveError::Setup(format!("token id {id} is outside the {rows}-row table"))),
        }
    }
    used.sort_unstable();
    used.dedup();
    Ok(used)
}

/// Row ids as little-endian `u32`s, for the wire.
pub fn encode_rows(rows: &[u32]) -> Bytes {
    rows.iter().flat_map(|r| r.to_le_bytes()).collect::<Vec<u8>>().into()
}

/// Row ids sent by `peer`, checked: whole `u32`s, strictly increasing, inside the table.
pub fn decode_rows(peer: usize, bytes: &[u8], rows: usize) -> Result<Vec<u32>, CollectiveError> {
    let lie = |reason: String| CollectiveError::Protocol { peer, reason };
    if !bytes.len().is_multiple_of(4) {
        return Err(lie(format!("sent a row list of {} bytes, not whole row ids", bytes.len())));
    }
    let ids: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    if let Some(bad) = ids.iter().find(|&&r| r as usize >= rows) {
        return Err(lie(format!("sent row {bad} of a {rows}-row table")));
    }
    if ids.windows(2).any(|w| w[0] >= w[1]) {
        return Err(lie("sent a row list that is not strictly increasing".into()));
    }
    Ok(ids)
}

/// The sorted union of sorted row lists.
pub fn union_rows(lists: &[Vec<u32>]) -> Vec<u32> {
    let mut all: Vec<u32> = lists.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Copies `rows` of a table with `width` columns into one contiguous buffer.
pub fn pack_rows(table: &[f32], width: usize, rows: &[u32]) -> Vec<f32> {
    let mut packed = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        let start = r as usize * width;
        packed.extend_from_slice(&table[start..start + width]);
    }
    packed
}

/// Writes packed rows back into their places in the table.
pub fn unpack_rows(table: &mut [f32], width: usize, rows: &[u32], packed: &[f32]) {
    for (&r, values) in rows.iter().zip(packed.chunks_exact(width)) {
        let start = r as usize * width;
        table[start..start + width].copy_from_slice(values);
    }
}

/// Replaces `table` (row-major, `width` columns) by its mean over all ranks, moving only the
/// rows some rank used. `used` lists this rank's rows (sorted, distinct, see [`used_rows`]); every
/// other row of `table` must be zero on this rank. Operation ids `first_op` (the row lists) and
/// `first_op + 1` (the values). Every rank ends with the same bits. Returns the rows moved
/// (the union over ranks). The values travel in `wire`'s format.
pub fn all_reduce_rows(
    t: &mut impl Transport,
    first_op: u64,
    table: &mut [f32],
    width: usize,
    used: &[u32],
    segment: usize,
    wire: Wire,
) -> Result<usize, CollectiveError> {
    if width == 0 || !table.len().is_multiple_of(width) {
        return Err(CollectiveError::Setup(format!("a table of {} floats has no rows of {width}", table.len())));
    }
    let rows = table.len() / width;
    let lists = gather(t, first_op, encode_rows(used))?
        .iter()
        .enumerate()
        .map(|(peer, bytes)| decode_rows(peer, bytes, rows))
        .collect::<Result<Vec<_>, _>>()?;
    let union = union_rows(&lists);
    let mut packed = pack_rows(table, width, &union);
    ring(t, first_op + 1, &mut packed, segment, RingMode::AllReduceMean, wire)?;
    unpack_rows(table, width, &union, &packed);
    Ok(union.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_rows_are_sorted_and_distinct() {
        assert_eq!(used_rows(&[5, 1, 5, 0, 3], 6).expect("in range"), vec![0, 1, 3, 5]);
        assert!(used_rows(&[6], 6).is_err());
        assert!(used_rows(&[-1], 6).is_err());
    }

    #[test]
    fn row_lists_round_trip_and_lies_are_named() {
        let rows = vec![0, 7, 9];
        assert_eq!(decode_rows(2, &encode_rows(&rows), 10).expect("valid"), rows);
        for (bytes, what) in [
            (vec![1u8, 2, 3], "not whole row ids"),
            (encode_rows(&[10]).to_vec(), "row 10 of a 10-row table"),
            (encode_rows(&[3, 3]).to_vec(), "not strictly increasing"),
        ] {
            let e = decode_rows(2, &bytes, 10).expect_err(what).to_string();
            assert!(e.starts_with("rank 2 ") && e.contains(what), "{e}");
        }
    }

    #[test]
    fn pack_then_unpack_restores_the_rows() {
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let rows = [0, 2];
        let packed = pack_rows(&table, 3, &rows);
        assert_eq!(packed, vec![0.0, 1.0, 2.0, 6.0, 7.0, 8.0]);
        let mut back = vec![0.0; 12];
        unpack_rows(&mut back, 3, &rows, &packed);
        assert_eq!(&back[0..3], &table[0..3]);
        assert_eq!(&back[6..9], &table[6..9]);
        assert_eq!(union_rows(&[vec![1, 4], vec![0, 4], vec![]]), vec![0, 1, 4]);
    }
}
