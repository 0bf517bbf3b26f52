//! Render ids: time-based (version 1) UUIDs, as Cassandra's `timeuuid`.
//!
//! A tid carries the time of the render it names; revstore orders renders of one
//! revision by that time ("precedence by revision, then render"). Tids made by one
//! process are strictly increasing even when the wall clock stalls or steps back:
//! the generator never hands out a tick at or below the last one it gave.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uuid::{Timestamp, Uuid};

use crate::KeyError;
use crate::domain::truncate_for_message;

/// 100-nanosecond ticks between the UUID epoch (1582-10-15) and the Unix epoch.
const GREGORIAN_OFFSET_TICKS: u64 = 0x01B2_1DD2_1381_4000;
const TICKS_PER_MICRO: u64 = 10;

/// A version 1 UUID. Ordered as Cassandra orders `timeuuid`: by time, then by the
/// remaining bytes compared as signed bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tid(Uuid);

impl Tid {
    /// A new tid for the current time from the process-wide generator.
    pub fn now() -> Tid {
        static GENERATOR: OnceLock<TidGenerator> = OnceLock::new();
        GENERATOR.get_or_init(TidGenerator::new).next()
    }

    /// Accepts only version 1 (time-based) UUIDs.
    pub fn from_uuid(uuid: Uuid) -> Result<Tid, KeyError> {
        if uuid.get_version_num() != 1 {
            return Err(KeyError::Tid { input: uuid.to_string(), reason: "not a time-based (version 1) UUID" });
        }
        Ok(Tid(uuid))
    }

    /// Parses the canonical hyphenated text form.
    pub fn parse(input: &str) -> Result<Tid, KeyError> {
        let fail = |reason| KeyError::Tid { input: truncate_for_message(input), reason };
        if input.len() != 36 {
            return Err(fail("expected a UUID in canonical form (8-4-4-4-12 hex digits)"));
        }
        let uuid = Uuid::try_parse(input).map_err(|_| fail("expected a UUID in canonical form (8-4-4-4-12 hex digits)"))?;
        Tid::from_uuid(uuid).map_err(|_| fail("not a time-based (version 1) UUID"))
    }

    /// The smallest tid of the given instant (Cassandra's `minTimeuuid`), for range bounds.
    pub fn min_at(time: SystemTime) -> Tid {
        let ticks = ticks_of(time);
        // Clock sequence and node all zero: with the variant bits, the smallest signed-byte value.
        Tid::from_parts(ticks, [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80])
    }

    /// A tid at `ticks` with the given last eight bytes (variant bits are forced).
    fn from_parts(ticks: u64, mut low: [u8; 8]) -> Tid {
        low[0] = (low[0] & 0x3f) | 0x80;
        let clock_seq = u16::from_be_bytes([low[0], low[1]]) & 0x3fff;
        let node: [u8; 6] = [low[2], low[3], low[4], low[5], low[6], low[7]];
        Tid(Uuid::new_v1(Timestamp::from_gregorian_time(ticks, clock_seq), &node))
    }

    pub fn uuid(&self) -> Uuid {
        self.0
    }

    /// 100 ns ticks since 1582-10-15, the tid's time.
    pub fn gregorian_ticks(&self) -> u64 {
        let b = self.0.as_bytes();
        let time_low = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64;
        let time_mid = u16::from_be_bytes([b[4], b[5]]) as u64;
        let time_hi = (u16::from_be_bytes([b[6], b[7]]) & 0x0fff) as u64;
        (time_hi << 48) | (time_mid << 32) | time_low
    }

    /// Microseconds since the Unix epoch (negative before 1970), the unit of
    /// Cassandra write timestamps.
    pub fn unix_micros(&self) -> i64 {
        (self.gregorian_ticks() as i64 - GREGORIAN_OFFSET_TICKS as i64) / TICKS_PER_MICRO as i64
    }

    pub fn time(&self) -> SystemTime {
        let micros = self.unix_micros();
        if micros >= 0 {
            UNIX_EPOCH + Duration::from_micros(micros as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
        }
    }
}

/// The earliest render time accepted: 2001-01-01T00:00:00Z. No wiki revision
/// predates MediaWiki's first wiki (Wikipedia opened on 2001-01-15), so an
/// earlier tid is a client's mistake (a zero or garbage timestamp), and
/// would carry a write timestamp that loses to everything.
pub const EARLIEST_RENDER_TIME: Duration = Duration::from_secs(978_307_200);

impl Tid {
    /// Refuses a tid whose time is implausible as a render time: more than
    /// [`crate::time::MAX_CLOCK_SKEW`] after `now`, or before [`EARLIEST_RENDER_TIME`].
    pub fn check_render_time(&self, now: SystemTime) -> Result<(), KeyError> {
        let fail = |reason| KeyError::Tid { input: self.to_string(), reason };
        if self.time() > now + crate::time::MAX_CLOCK_SKEW {
            return Err(fail("it lies in the future, beyond the allowed clock skew of 300 s"));
        }
        if self.time() < UNIX_EPOCH + EARLIEST_RENDER_TIME {
            return Err(fail("it lies before 2001-01-01, earlier than any wiki revision"));
        }
        Ok(())
    }
}

fn ticks_of(time: SystemTime) -> u64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => GREGORIAN_OFFSET_TICKS + (since.as_nanos() / 100) as u64,
        Err(before) => GREGORIAN_OFFSET_TICKS.saturating_sub((before.duration().as_nanos() / 100) as u64),
    }
}

impl Ord for Tid {
    fn cmp(&self, other: &Self) -> Ordering {
        self.gregorian_ticks().cmp(&other.gregorian_ticks()).then_with(|| {
            let a = &self.0.as_bytes()[8..];
            let b = &other.0.as_bytes()[8..];
            a.iter().map(|&x| x as i8).cmp(b.iter().map(|&x| x as i8))
        })
    }
}

impl PartialOrd for Tid {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tid({})", self.0.hyphenated())
    }
}

impl std::str::FromStr for Tid {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tid::parse(s)
    }
}

impl serde::Serialize for Tid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Hands out strictly increasing tids. One random node id and clock sequence per
/// generator, so two processes practically never produce the same tid.
#[derive(Debug)]
pub struct TidGenerator {
    last_ticks: Mutex<u64>,
    low: [u8; 8],
}

impl Default for TidGenerator {
    fn default() -> Self {
        Self::new()
    }
}

impl TidGenerator {
    pub fn new() -> Self {
        let mut low: [u8; 8] = rand::random();
        // A random node id must have the multicast bit set (RFC 9562, section 6.10).
        low[2] |= 0x01;
        TidGenerator { last_ticks: Mutex::new(0), low }
    }

    pub fn next(&self) -> Tid {
        self.next_at(SystemTime::now())
    }

    /// The next tid, at `now` unless that is not after the last tid handed out.
    pub fn next_at(&self, now: SystemTime) -> Tid {
        let mut last = self.last_ticks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let ticks = ticks_of(now).max(*last + 1);
        *last = ticks;
        Tid::from_parts(ticks, self.low)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_accepts_only_canonical_v1() {
        let tid = Tid::now();
        assert_eq!(Tid::parse(&tid.to_string()).unwrap(), tid);
        let v4 = Uuid::new_v4().to_string();
        assert!(Tid::parse(&v4).unwrap_err().to_string().contains("version 1"));
        for bad in ["", "not-a-uuid", "5e4ae5f0c53411e7a9c4bd0fa4d2e4e0", "{5e4ae5f0-c534-11e7-a9c4-bd0fa4d2e4e0}"] {
            assert!(Tid::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keeps_increasing_when_the_clock_stalls_or_steps_back() {
        let generator = TidGenerator::new();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut previous = generator.next_at(t0);
        for now in [t0, t0, t0 - Duration::from_secs(3600), t0 + Duration::from_nanos(50), t0 + Duration::from_secs(1)] {
            let next = generator.next_at(now);
            assert!(next > previous, "{next:?} is not after {previous:?}");
            previous = next;
        }
        assert_eq!(previous.time(), t0 + Duration::from_secs(1));
    }

    #[test]
    fn time_round_trips_at_microsecond_precision() {
        let t = UNIX_EPOCH + Duration::from_micros(1_764_000_000_123_456);
        let tid = TidGenerator::new().next_at(t);
        assert_eq!(tid.time(), t);
        assert_eq!(tid.unix_micros(), 1_764_000_000_123_456);
        assert_eq!(tid.uuid().get_version_num(), 1);
    }

    #[test]
    fn render_times_must_be_plausible() {
        let now = SystemTime::now();
        assert!(Tid::min_at(now).check_render_time(now).is_ok());
        assert!(Tid::min_at(now + Duration::from_secs(299)).check_render_time(now).is_ok());
        assert!(Tid::min_at(UNIX_EPOCH + EARLIEST_RENDER_TIME).check_render_time(now).is_ok());
        let future = Tid::min_at(now + Duration::from_secs(301)).check_render_time(now).unwrap_err().to_string();
        assert!(future.contains("future"), "{future}");
        let ancient = Tid::parse("00000000-0000-1000-8000-000000000000").unwrap();
        assert!(ancient.time() < UNIX_EPOCH, "a tid from 1582");
        assert!(ancient.check_render_time(now).unwrap_err().to_string().contains("before 2001"));
        let day_before = Tid::min_at(UNIX_EPOCH + EARLIEST_RENDER_TIME - Duration::from_secs(1));
        assert!(day_before.check_render_time(now).is_err());
    }

    #[test]
    fn min_at_sorts_before_every_tid_of_that_instant() {
        let t = UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let min = Tid::min_at(t);
        for _ in 0..100 {
            assert!(TidGenerator::new().next_at(t) >= min);
        }
        assert!(Tid::min_at(t + Duration::from_micros(1)) > TidGenerator::new().next_at(t));
    }

    proptest! {
        #[test]
        fn tid_order_equals_time_order(a in 0u64..4_000_000_000_000_000, b in 0u64..4_000_000_000_000_000) {
            let (ta, tb) = (UNIX_EPOCH + Duration::from_micros(a), UNIX_EPOCH + Duration::from_micros(b));
            let (x, y) = (TidGenerator::new().next_at(ta), TidGenerator::new().next_at(tb));
            if a != b {
                prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            }
            prop_assert_eq!(x.time(), ta);
        }
    }
}
