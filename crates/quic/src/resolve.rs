//! Host names to addresses, asked again until the rendezvous deadline. A name that does not
//! resolve yet is the usual state of a fresh cluster, not an error: a Kubernetes pod's DNS
//! record appears seconds after the pod starts, so a node started beside its coordinator may
//! find the coordinator's name unknown at first. The schedule ([`Retry`]) and the loop
//! ([`resolve_with`]) take the lookup and the clock as arguments; [`resolve`] gives them the
//! system's.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::QuicError;

/// The pause after the first failed lookup; each next one is twice the last, up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between lookups: a record that appears is found within it.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// Failed lookups between two log lines of a wait (about 10 s apart once the pauses are long).
const LOG_EVERY: u32 = 10;

/// What one lookup of a `host:port` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The first address of the name.
    Found(SocketAddr),
    /// No address yet (unknown name, no answer from DNS): a later lookup may find one.
    NotYet(String),
    /// Not a `host:port` at all: no later lookup differs.
    Malformed(String),
}

/// Time as the retries see it: the system's, or a test's.
pub(crate) trait Clock {
    /// Now.
    fn now(&self) -> Instant;
    /// Waits `pause`.
    async fn sleep(&self, pause: Duration);
}

/// The system's clock, through tokio.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    async fn sleep(&self, pause: Duration) {
        tokio::time::sleep(pause).await;
    }
}

/// When to ask again for a name that did not resolve, until a deadline.
#[derive(Debug)]
pub(crate) struct Retry {
    until: Instant,
    pause: Duration,
    failed: u32,
}

impl Retry {
    /// A schedule whose last lookup starts before `until`.
    pub(crate) fn until(until: Instant) -> Self {
        Retry { until, pause: FIRST_PAUSE, failed: 0 }
    }

    /// After a failed lookup at `now`: the pause before the next one, or `None` when that one
    /// would start at or past the deadline.
    pub(crate) fn after_failure(&mut self, now: Instant) -> Option<Duration> {
        self.failed += 1;
        let pause = self.pause;
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        (now + pause < self.until).then_some(pause)
    }

    /// Whether the failure just counted is one to log: the first, then every [`LOG_EVERY`]th.
    fn worth_logging(&self) -> bool {
        self.failed % LOG_EVERY == 1
    }
}

/// `host_port`'s address from `lookup`, asked again on `clock` until `until`; the error names
/// the name and what to check.
pub(crate) async fn resolve_with(
    host_port: &str,
    until: Instant,
    mut lookup: impl AsyncFnMut(&str) -> Lookup,
    clock: &impl Clock,
) -> Result<SocketAddr, QuicError> {
    let started = clock.now();
    let mut retry = Retry::until(until);
    loop {
        let reason = match lookup(host_port).await {
            Lookup::Found(addr) => return Ok(addr),
            Lookup::Malformed(reason) => return Err(QuicError::Setup(format!("`{host_port}`: {reason}"))),
            Lookup::NotYet(reason) => reason,
        };
        let now = clock.now();
        let Some(pause) = retry.after_failure(now) else {
            return Err(QuicError::Unresolved { name: host_port.to_string(), waited: now - started, reason });
        };
        if retry.worth_logging() {
            let left = until.saturating_duration_since(now).as_secs_f64();
            tracing::info!("{host_port} does not resolve yet ({reason}); asking again for {left:.1} s more");
        }
        clock.sleep(pause).await;
    }
}

/// `host_port`'s address as the system's resolver gives it, asked again until `until`.
pub(crate) async fn resolve(host_port: &str, until: Instant) -> Result<SocketAddr, QuicError> {
    resolve_with(host_port, until, async |name: &str| lookup(name, until).await, &SystemClock).await
}

/// One lookup of `host_port` by the system's resolver, given up at `until`.
pub(crate) async fn lookup(host_port: &str, until: Instant) -> Lookup {
    match tokio::time::timeout_at(until, tokio::net::lookup_host(host_port)).await {
        Err(_) => Lookup::NotYet("no answer from DNS".into()),
        // A missing or bad port, or an address that cannot be one.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidInput => {
            Lookup::Malformed(format!("{e} (give host:port)"))
        }
        Ok(Err(e)) => Lookup::NotYet(e.to_string()),
        Ok(Ok(mut addrs)) => addrs.next().map_or_else(|| Lookup::NotYet("no address".into()), Lookup::Found),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A clock that moves only when slept on.
    struct FakeClock(Cell<Instant>);

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.0.get()
        }

        async fn sleep(&self, pause: Duration) {
            self.0.set(self.0.get() + pause);
        }
    }

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(future)
    }

    fn addr() -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 7], 29500))
    }

    /// A resolver that knows `name` from its `known_from`th lookup on, counting lookups.
    fn appearing(known_from: u32, asked: &Cell<u32>) -> impl AsyncFnMut(&str) -> Lookup + '_ {
        async move |name: &str| {
            asked.set(asked.get() + 1);
            match asked.get() >= known_from {
                true => Lookup::Found(addr()),
                false => Lookup::NotYet(format!("{name}: Name or service not known")),
            }
        }
    }

    #[test]
    fn a_name_that_appears_after_a_few_lookups_is_found() {
        let clock = FakeClock(Cell::new(Instant::now()));
        let start = clock.now();
        let asked = Cell::new(0);
        let found = run(resolve_with("lead.job:29500", start + Duration::from_secs(120), appearing(5, &asked), &clock));
        assert_eq!(found.expect("found"), addr());
        assert_eq!(asked.get(), 5);
        // Paused 100 + 200 + 400 + 800 ms between the five lookups.
        assert_eq!(clock.now() - start, Duration::from_millis(1500));
    }

    #[test]
    fn a_name_that_never_resolves_is_named_at_the_deadline() {
        let clock = FakeClock(Cell::new(Instant::now()));
        let start = clock.now();
        let asked = Cell::new(0);
        let err = run(resolve_with(
            "no-such-host.invalid:29500",
            start + Duration::from_secs(10),
            appearing(u32::MAX, &asked),
            &clock,
        ))
        .expect_err("never resolves");
        // Lookups at 0, 0.1, 0.3, 0.7 s (pauses doubling from 100 ms), then one a second from
        // 1.5 s to 9.5 s: the next would start past the 10 s deadline.
        assert_eq!(asked.get(), 13);
        assert_eq!(clock.now() - start, Duration::from_millis(9500));
        let message = err.to_string();
        assert!(matches!(err, QuicError::Unresolved { .. }), "{err:?}");
        assert!(
            message.contains("no-such-host.invalid:29500") && message.contains("Name or service not known"),
            "{message}"
        );
        assert!(message.contains("check"), "says what to check: {message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }

    #[test]
    fn a_malformed_address_fails_at_once() {
        let clock = FakeClock(Cell::new(Instant::now()));
        let until = clock.now() + Duration::from_secs(120);
        let asked = Cell::new(0);
        let malformed = async |_: &str| {
            asked.set(asked.get() + 1);
            Lookup::Malformed("invalid socket address".into())
        };
        let err = run(resolve_with("lead.job", until, malformed, &clock)).expect_err("no port");
        assert_eq!(asked.get(), 1);
        assert!(err.to_string().contains("`lead.job`"), "{err}");
    }

    #[test]
    fn the_schedule_doubles_its_pauses_and_stops_before_the_deadline() {
        let start = Instant::now();
        let mut retry = Retry::until(start + Duration::from_secs(3));
        let pauses: Vec<u64> =
            std::iter::from_fn(|| retry.after_failure(start).map(|p| p.as_millis() as u64)).take(8).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000, 1000, 1000], "each from the start: all before 3 s");
        let mut retry = Retry::until(start + Duration::from_secs(3));
        assert_eq!(retry.after_failure(start + Duration::from_millis(2950)), None, "the next would start past 3 s");
    }

    #[test]
    fn the_system_resolver_finds_an_address_and_refuses_a_missing_port() {
        let until = Instant::now() + Duration::from_secs(5);
        let found = run(async { lookup("127.0.0.1:29500", until).await });
        assert_eq!(found, Lookup::Found(SocketAddr::from(([127, 0, 0, 1], 29500))));
        let malformed = run(async { lookup("127.0.0.1", until).await });
        assert!(matches!(malformed, Lookup::Malformed(_)), "{malformed:?}");
    }
}
