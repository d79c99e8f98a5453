//! Wall-clock time for reports and benchmark output: UTC civil dates without a time-zone database.
//!
//! Thread-safety: pure functions (and [`unix_now_s`], which reads the system clock).

/// A UTC date and time, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcDateTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl UtcDateTime {
    /// The date and time `unix_s` seconds after 1970-01-01T00:00:00 UTC (proleptic Gregorian
    /// calendar; H. Hinnant's days-to-civil algorithm).
    pub fn from_unix(unix_s: u64) -> UtcDateTime {
        let z = (unix_s / 86_400) as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let s = unix_s % 86_400;
        UtcDateTime {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: (s / 3600) as u32,
            minute: (s / 60 % 60) as u32,
            second: (s % 60) as u32,
        }
    }

    /// `YYYY-MM-DD` and `HH:MM:SS` joined by `sep` (`'T'`: ISO 8601 without a zone suffix, as
    /// JUnit's `timestamp`; `' '`: nccl-tests' `%Y-%m-%d %H:%M:%S`).
    pub fn format(&self, sep: char) -> String {
        format!(
            "{:04}-{:02}-{:02}{sep}{:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// Seconds since 1970-01-01T00:00:00 UTC now (0 if the clock is before it).
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_are_right_across_leap_days_and_centuries() {
        let f = |s| UtcDateTime::from_unix(s).format('T');
        assert_eq!(f(0), "1970-01-01T00:00:00");
        assert_eq!(f(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(f(1_700_000_000), "2023-11-14T22:13:20");
        assert_eq!(f(4_102_444_799), "2099-12-31T23:59:59");
        assert_eq!(
            UtcDateTime::from_unix(86_399).format(' '),
            "1970-01-01 23:59:59"
        );
    }
}
