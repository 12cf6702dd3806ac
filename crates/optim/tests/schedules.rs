//! Every schedule against the values `transformers.get_scheduler` gives at every step
//! (`tests/fixtures/schedules/make_schedules.py`).

use ringtune_optim::{LrSchedule, ScheduleKind};
use serde_json::Value;

#[test]
fn every_schedule_matches_transformers_at_every_step() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/schedules/schedules.json");
    let text = std::fs::read_to_string(path).expect("the fixture (make_schedules.py writes it)");
    let fixture: Value = serde_json::from_str(&text).expect("JSON");
    let cases = fixture["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 6 * 5, "every kind, every case");
    for case in cases {
        let kind: ScheduleKind = case["kind"].as_str().expect("kind").parse().expect("a kind we have");
        let number = |key: &str| case[key].as_u64().expect(key);
        let schedule = LrSchedule {
            kind,
            peak: case["peak"].as_f64().expect("peak"),
            warmup: number("warmup"),
            total: number("total"),
        };
        for (step, expected) in case["lr"].as_array().expect("lr").iter().enumerate() {
            let expected = expected.as_f64().expect("a rate");
            let ours = schedule.lr(step as u64);
            let close = (ours - expected).abs() <= 1e-12 * expected.abs().max(1e-12);
            assert!(close, "{kind} {schedule:?} step {step}: ours {ours:e}, transformers {expected:e}");
        }
    }
}
