//! Load shedding.
//!
//! Past its CPU capacity a server that takes every request queues without bound: each one waits
//! longer for a turn on the runtime, latency and memory grow until clients time out, and work is
//! spent on answers nobody waits for. Baton watches the delay its own runtime adds to a task that
//! asked to wake at a set time (the same scheduling delay every request waits through). Once that
//! delay has stayed above a target for a whole interval (CoDel's rule: a standing queue, not a
//! burst), API requests are refused with 503 `OVERLOADED` and `Retry-After` until it falls back
//! under the target. The wait of requests for room in a full invocation-log queue (the database
//! behind) counts the same way: brief back-pressure is absorbed, a standing wait sheds.
//!
//! A fixed cap on requests in flight would be the wrong tool: a model call takes seconds, so
//! thousands in flight is a normal day, while a few hundred CPU-bound ones can be too many.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use baton_store::runs::RunWriter;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::ApiError;

/// When to start refusing requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverloadConfig {
    /// Scheduling delay tolerated as a standing queue; zero turns shedding off.
    pub target_delay: Duration,
    /// How long the delay must stay above the target before requests are refused.
    pub interval: Duration,
}

impl OverloadConfig {
    pub const OFF: OverloadConfig = OverloadConfig {
        target_delay: Duration::ZERO,
        interval: Duration::ZERO,
    };

    pub fn is_enabled(&self) -> bool {
        !self.target_delay.is_zero()
    }

    /// What a refused client is told to wait: long enough for a queue to drain.
    fn retry_after(&self) -> Duration {
        self.interval.max(Duration::from_secs(1))
    }
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            target_delay: Duration::from_millis(50),
            interval: Duration::from_millis(500),
        }
    }
}

/// How often the probe measures: often enough to see an interval's worth of samples, rarely
/// enough to cost nothing measurable.
const PROBE_PERIOD: Duration = Duration::from_millis(20);

/// Measurements without an API request arriving after which a probe parks until one does.
/// An idle server's probes would otherwise wake each runtime 50 times a second (about 6 ms
/// of CPU a second on this two-vCPU VM, each wake-up a halted vCPU's); a queue forms only
/// where requests arrive, and one second of silence is far longer than any shedding interval
/// needs to see a queue that is still being fed.
const IDLE_TICKS_BEFORE_PARKING: u32 = 50;

/// Probes that can park; a probe past this count measures on, idle or not.
const PARKING_PROBES: usize = 64;

/// The shedding state, read by every API request and written by the probes.
#[derive(Debug)]
pub struct Overload {
    config: OverloadConfig,
    shedding: AtomicBool,
    /// The largest of the probes' latest delays.
    last_delay_micros: AtomicU64,
    /// Each probe's latest reading; a probe's place is its index.
    probes: Mutex<Vec<ProbeReading>>,
    /// Per probe: an API request arrived since it last looked. Set by requests only when
    /// clear, so a busy server's requests only read them.
    arrivals: [AtomicBool; PARKING_PROBES],
    /// How many probes have been started (the first [`PARKING_PROBES`] have an arrival flag);
    /// `probes.len()` kept as an atomic so requests need not take the lock.
    probe_count: AtomicUsize,
    /// Wakes parked probes; shared with them so a parked probe holds no `Overload` (its drop
    /// wakes them to end).
    wake: Arc<Notify>,
    /// Measurements taken, by every probe.
    ticks: AtomicU64,
}

impl Drop for Overload {
    fn drop(&mut self) {
        self.wake.notify_waiters();
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ProbeReading {
    delay: Duration,
    /// When the delay last went above the target (None: it is under it).
    above_since: Option<Instant>,
}

impl Overload {
    pub fn new(config: OverloadConfig) -> Arc<Overload> {
        Arc::new(Overload {
            config,
            shedding: AtomicBool::new(false),
            last_delay_micros: AtomicU64::new(0),
            probes: Mutex::new(Vec::new()),
            arrivals: std::array::from_fn(|_| AtomicBool::new(false)),
            probe_count: AtomicUsize::new(0),
            wake: Arc::new(Notify::new()),
            ticks: AtomicU64::new(0),
        })
    }

    /// Called for every API request: marks the arrival for each probe that has not seen one
    /// since it last looked, and wakes parked probes.
    pub fn note_arrival(&self) {
        let probes = self.probe_count.load(Ordering::Relaxed).min(PARKING_PROBES);
        let mut woke = false;
        for flag in &self.arrivals[..probes] {
            if !flag.load(Ordering::Relaxed) {
                flag.store(true, Ordering::Relaxed);
                woke = true;
            }
        }
        if woke {
            self.wake.notify_waiters();
        }
    }

    /// Whether a request arrived since probe `probe` last asked (a probe without a flag
    /// always hears yes).
    fn take_arrival(&self, probe: usize) -> bool {
        self.arrivals
            .get(probe)
            .is_none_or(|flag| flag.swap(false, Ordering::Relaxed))
    }

    /// How many measurements the probes have taken.
    pub fn probe_ticks(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }

    /// Whether new API requests are being refused.
    pub fn is_shedding(&self) -> bool {
        self.shedding.load(Ordering::Relaxed)
    }

    /// The queueing delay of the most delayed runtime at its latest probe.
    pub fn queue_delay(&self) -> Duration {
        Duration::from_micros(self.last_delay_micros.load(Ordering::Relaxed))
    }

    /// Takes probe `probe`'s measurement of its runtime's queueing delay, made at `now`;
    /// returns whether requests are refused from now on. A server with one runtime per thread
    /// runs a probe on each: requests are refused while any of them has a standing queue (a
    /// client cannot choose the thread its connection lands on).
    pub fn observe(&self, probe: usize, delay: Duration, now: Instant) -> bool {
        let mut probes = self.probes();
        if probes.len() <= probe {
            probes.resize(probe + 1, ProbeReading::default());
        }
        let reading = &mut probes[probe];
        reading.delay = delay;
        reading.above_since = if delay <= self.config.target_delay {
            None
        } else {
            Some(reading.above_since.unwrap_or(now))
        };
        let largest = probes.iter().map(|r| r.delay).max().unwrap_or_default();
        self.last_delay_micros.store(
            u64::try_from(largest.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if !self.config.is_enabled() {
            return false;
        }
        let shedding = probes.iter().any(|r| {
            r.above_since
                .is_some_and(|since| now.saturating_duration_since(since) >= self.config.interval)
        });
        if shedding != self.shedding.swap(shedding, Ordering::Relaxed) {
            if shedding {
                tracing::warn!(
                    delay_ms = largest.as_millis(),
                    "overloaded: refusing new API requests until the queueing delay falls"
                );
            } else {
                tracing::info!("no longer overloaded: taking API requests again");
            }
        }
        shedding
    }

    /// Starts measuring on a task of the current runtime: its scheduling delay, and the wait
    /// for room in `log`'s queue when runs are logged. Called once per runtime that serves
    /// requests. The task ends when the last handle to `self` is dropped.
    pub fn spawn_probe(self: &Arc<Self>, log: Option<RunWriter>) {
        let probe = {
            let mut probes = self.probes();
            probes.push(ProbeReading::default());
            probes.len() - 1
        };
        self.probe_count.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(probe_loop(
            Arc::downgrade(self),
            self.wake.clone(),
            probe,
            log,
        ));
    }

    fn probes(&self) -> std::sync::MutexGuard<'_, Vec<ProbeReading>> {
        self.probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn probe_loop(
    overload: Weak<Overload>,
    wake: Arc<Notify>,
    probe: usize,
    log: Option<RunWriter>,
) {
    let mut due = Instant::now() + PROBE_PERIOD;
    let mut idle_ticks = 0;
    loop {
        tokio::time::sleep_until(due).await;
        let now = Instant::now();
        let Some(state) = overload.upgrade() else {
            return;
        };
        let scheduling = now.saturating_duration_since(due);
        let log_wait = log.as_ref().map_or(Duration::ZERO, RunWriter::longest_wait);
        state.observe(probe, scheduling.max(log_wait), now);
        state.ticks.fetch_add(1, Ordering::Relaxed);
        idle_ticks = if state.take_arrival(probe) {
            0
        } else {
            idle_ticks + 1
        };
        if idle_ticks >= IDLE_TICKS_BEFORE_PARKING {
            idle_ticks = 0;
            // Registered before the last look, so an arrival between the two still wakes it.
            let arrived = wake.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if !state.take_arrival(probe) {
                // Idle is no queue: a parked probe must not keep shedding on.
                state.observe(probe, Duration::ZERO, now);
                drop(state);
                arrived.await;
                due = Instant::now() + PROBE_PERIOD;
                continue;
            }
        }
        due = now + PROBE_PERIOD;
    }
}

impl Overload {
    /// The 503 `OVERLOADED` answer while Baton is overloaded (see the module docs); checked first
    /// on every API request (`auth::require_auth`), so refusing stays cheap.
    pub fn refusal(&self) -> Option<Response> {
        self.is_shedding().then(|| {
            ApiError::Overloaded {
                retry_after: self.config.retry_after(),
            }
            .into_response()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn overload() -> Arc<Overload> {
        Overload::new(OverloadConfig {
            target_delay: 50 * MS,
            interval: 500 * MS,
        })
    }

    #[test]
    fn a_burst_shorter_than_the_interval_is_absorbed() {
        let overload = overload();
        let start = Instant::now();
        for step in 0..20 {
            assert!(!overload.observe(0, 200 * MS, start + step * 20 * MS));
        }
        // One sample under the target ends the episode: the clock starts again.
        assert!(!overload.observe(0, 10 * MS, start + 400 * MS));
        assert!(!overload.observe(0, 200 * MS, start + 600 * MS));
        assert!(!overload.is_shedding());
    }

    #[test]
    fn a_standing_delay_for_the_interval_sheds_until_it_falls() {
        let overload = overload();
        let start = Instant::now();
        assert!(!overload.observe(0, 80 * MS, start));
        assert!(!overload.observe(0, 80 * MS, start + 499 * MS));
        assert!(overload.observe(0, 60 * MS, start + 500 * MS));
        assert!(overload.is_shedding());
        assert_eq!(overload.queue_delay(), 60 * MS);
        assert!(overload.observe(0, 51 * MS, start + 900 * MS));
        assert!(!overload.observe(0, 50 * MS, start + 920 * MS));
        assert!(!overload.is_shedding());
    }

    #[test]
    fn one_runtime_with_a_standing_queue_sheds_for_all() {
        let overload = overload();
        let start = Instant::now();
        assert!(!overload.observe(1, 80 * MS, start));
        // The other runtime is idle, which neither ends the busy one's episode nor hides it.
        assert!(!overload.observe(0, MS, start + 250 * MS));
        assert_eq!(overload.queue_delay(), 80 * MS);
        assert!(overload.observe(0, MS, start + 500 * MS));
        assert!(overload.is_shedding());
        assert!(!overload.observe(1, 10 * MS, start + 520 * MS));
        assert_eq!(overload.queue_delay(), 10 * MS);
    }

    #[test]
    fn off_never_sheds_but_still_reports_the_delay() {
        let overload = Overload::new(OverloadConfig::OFF);
        let start = Instant::now();
        for step in 0..100 {
            assert!(!overload.observe(0, Duration::from_secs(5), start + step * 100 * MS));
        }
        assert_eq!(overload.queue_delay(), Duration::from_secs(5));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_idle_servers_probe_parks_until_a_request_arrives() {
        let overload = overload();
        overload.spawn_probe(None);
        // Requests keep it measuring.
        for _ in 0..100 {
            overload.note_arrival();
            tokio::time::sleep(10 * MS).await;
        }
        let busy = overload.probe_ticks();
        assert!(
            (45..=55).contains(&busy),
            "{busy} measurements in a busy second"
        );
        // A second without one, and it stops.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let parked = overload.probe_ticks();
        assert!(
            parked - busy <= 52,
            "{} measurements after the last request",
            parked - busy
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(overload.probe_ticks(), parked, "a parked probe measured");
        // The next request wakes it.
        overload.note_arrival();
        tokio::time::sleep(100 * MS).await;
        let woken = overload.probe_ticks() - parked;
        assert!(
            (4..=6).contains(&woken),
            "{woken} measurements after a request"
        );
        // Dropping the state ends a parked probe's task.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let weak = Arc::downgrade(&overload);
        drop(overload);
        assert!(weak.upgrade().is_none(), "a parked probe kept the state");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_probe_sees_a_saturated_runtime_and_its_recovery() {
        let overload = Overload::new(OverloadConfig {
            target_delay: 30 * MS,
            interval: 100 * MS,
        });
        overload.spawn_probe(None);
        // Keep the only worker busy, as a saturated runtime is, giving the probe a turn now
        // and then: each turn it finds itself late by about the time it was kept waiting.
        let mut shed = false;
        for _ in 0..40 {
            std::thread::sleep(60 * MS);
            tokio::time::sleep(MS).await;
            if overload.is_shedding() {
                shed = true;
                break;
            }
        }
        assert!(shed, "never shed; last delay {:?}", overload.queue_delay());
        assert!(overload.queue_delay() > 30 * MS);
        // Left alone, the runtime catches up and requests are taken again.
        for _ in 0..500 {
            if !overload.is_shedding() {
                return;
            }
            tokio::time::sleep(10 * MS).await;
        }
        panic!("still shedding on an idle runtime");
    }

    #[tokio::test]
    async fn a_standing_wait_for_room_in_the_log_queue_sheds() {
        use baton_store::runs::test_support::{run_item, stuck_writer};

        // The database is gone: the queue (one place) fills and the next caller waits for room
        // for as long as it stays away.
        let writer = stuck_writer(1).await;
        writer.write(run_item(1)).await.unwrap();
        let waiting = tokio::spawn({
            let writer = writer.clone();
            async move { writer.write(run_item(2)).await }
        });

        let overload = Overload::new(OverloadConfig {
            target_delay: 20 * MS,
            interval: 50 * MS,
        });
        overload.spawn_probe(Some(writer.clone()));
        for _ in 0..500 {
            if overload.is_shedding() {
                break;
            }
            tokio::time::sleep(10 * MS).await;
        }
        assert!(overload.is_shedding(), "a caller waits, yet no shedding");
        assert!(overload.queue_delay() > 20 * MS);
        // The caller leaves: nothing waits any more, so shedding ends.
        waiting.abort();
        let _ = waiting.await;
        for _ in 0..500 {
            if !overload.is_shedding() {
                return;
            }
            tokio::time::sleep(10 * MS).await;
        }
        panic!("still shedding with no caller waiting");
    }
}
