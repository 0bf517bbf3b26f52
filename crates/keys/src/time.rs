//! Time as revstore writes and shows it: the one place for milliseconds
//! since the epoch, RFC 3339 text and the clock-skew limit.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far ahead of this host's clock a time a client gives (a render time,
/// a change, an update) may lie: the clock skew allowed between hosts.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Milliseconds since the Unix epoch (0 before it), as `timestamp` cells hold time.
pub fn millis(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A `timestamp` cell's milliseconds as a time (the epoch for negative ones).
pub fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Milliseconds since the epoch as RFC 3339 text.
pub fn rfc3339_millis(ms: i64) -> String {
    rfc3339(from_millis(ms))
}

/// A time as RFC 3339 in UTC with microseconds (how render times are shown).
pub fn rfc3339(time: SystemTime) -> String {
    let micros = time.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0);
    let secs = micros.div_euclid(1_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z", rem / 3600, (rem % 3600) / 60, rem % 60, micros.rem_euclid(1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_and_text_round_trip_and_clamp_before_the_epoch() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339_millis(-5), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339_millis(1_700_000_000_123), "2023-11-14T22:13:20.123000Z");
        assert_eq!(millis(from_millis(1_700_000_000_123)), 1_700_000_000_123);
    }
}
