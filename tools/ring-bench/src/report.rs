//! The table: per size, the slowest rank's median time, bandwidths beside gloo's, and where
//! the time goes (datagram size, packets, losses, congestion events, UDP buffer errors, CPU
//! seconds per gigabyte sent).

use crate::child::ChildReport;
use crate::gloo::Gloo;

/// One size's figures over every rank.
pub(crate) struct Row {
    pub(crate) floats: usize,
    pub(crate) seconds: f64,
    pub(crate) busbw: f64,
    datagram_size: u16,
    datagrams: u64,
    lost: u64,
    congestion_events: u64,
    buffer_errors: u64,
    cpu_s_per_gb: f64,
    max_error: f64,
}

/// The row of `floats` from every rank's report (`shared_namespace`: the ranks' UDP counters
/// are one namespace's, so they are not added up).
pub(crate) fn row(reports: &[ChildReport], floats: usize, ranks: usize, shared_namespace: bool) -> Row {
    let per_rank: Vec<&ChildReport> = reports.iter().filter(|r| r.floats == floats).collect();
    let repeats = per_rank.iter().map(|r| r.seconds.len()).min().unwrap_or(0);
    let mut slowest: Vec<f64> =
        (0..repeats).map(|k| per_rank.iter().map(|r| r.seconds[k]).fold(0.0, f64::max)).collect();
    slowest.sort_by(f64::total_cmp);
    let seconds = slowest.get(slowest.len() / 2).copied().unwrap_or(f64::NAN);
    let n = ranks as f64;
    let busbw = floats as f64 * 4.0 / seconds / 1e9 * 2.0 * (n - 1.0) / n;
    let sum = |f: fn(&ChildReport) -> u64| per_rank.iter().map(|r| f(r)).sum::<u64>();
    let buffer_errors = if shared_namespace {
        per_rank.iter().map(|r| r.udp_buffer_errors).max().unwrap_or(0)
    } else {
        sum(|r| r.udp_buffer_errors)
    };
    let cpu: f64 = per_rank.iter().map(|r| r.cpu_s).sum();
    Row {
        floats,
        seconds,
        busbw,
        datagram_size: per_rank.iter().map(|r| r.datagram_size).max().unwrap_or(0),
        datagrams: sum(|r| r.datagrams_sent),
        lost: sum(|r| r.lost_packets),
        congestion_events: sum(|r| r.congestion_events),
        buffer_errors,
        cpu_s_per_gb: cpu / (sum(|r| r.payload_bytes) as f64 / 1e9),
        max_error: per_rank.iter().map(|r| r.max_error).fold(0.0, f64::max),
    }
}

/// Prints the hash of the result, and fails unless every rank holds the same bits for each size.
pub(crate) fn results(reports: &[ChildReport]) -> anyhow::Result<()> {
    let mut sizes: Vec<usize> = reports.iter().map(|r| r.floats).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for floats in sizes {
        let of_size: Vec<&ChildReport> = reports.iter().filter(|r| r.floats == floats).collect();
        let first = &of_size[0].result;
        if let Some(other) = of_size.iter().find(|r| &r.result != first) {
            anyhow::bail!("{floats} floats: rank {} holds other bits than rank {}", other.rank, of_size[0].rank);
        }
        println!("result of {floats} floats: sha256 {first} on every rank");
    }
    Ok(())
}

/// Prints the table of `rows` beside `gloo`.
pub(crate) fn print(rows: &[Row], gloo: &Gloo, verify: bool) {
    println!(
        "| floats | MB | seconds | busbw GB/s | gloo busbw GB/s ({}) | vs gloo | datagram bytes | datagrams sent | lost | congestion events | UDP buffer errors | CPU s per GB sent |{}",
        gloo.source,
        if verify { " max error |" } else { "" }
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|{}", if verify { "---|" } else { "" });
    for r in rows {
        let theirs = gloo.get(r.floats);
        let ratio = theirs.parse::<f64>().map_or("-".to_string(), |g| format!("{:.2}x", r.busbw / g));
        println!(
            "| {} | {:.1} | {:.3} | {:.2} | {theirs} | {ratio} | {} | {} | {} | {} | {} | {:.2} |{}",
            r.floats,
            r.floats as f64 * 4.0 / 1e6,
            r.seconds,
            r.busbw,
            r.datagram_size,
            r.datagrams,
            r.lost,
            r.congestion_events,
            r.buffer_errors,
            r.cpu_s_per_gb,
            if verify { format!(" {:.1e} |", r.max_error) } else { String::new() }
        );
    }
}
