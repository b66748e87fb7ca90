//! `strftime_now(format)`: the clock of a chat template, formatted as Python's
//! `datetime.now().strftime(format)` formats it (C locale). A fixed clock makes renderings
//! reproducible (`--now`); otherwise the current time, in UTC.
//!
//! A civil date comes from days since 1970-01-01 by the proleptic Gregorian calendar (Howard
//! Hinnant's `civil_from_days`); the weekday from the same count (1970-01-01 was a Thursday).

use crate::error::{Error, Result};

/// A moment to the second, in the proleptic Gregorian calendar (no time zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    /// The year (proleptic Gregorian; may be negative).
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    /// 0..=23
    pub hour: u32,
    /// 0..=59
    pub minute: u32,
    /// 0..=59
    pub second: u32,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146097 + doe - 719468
}

/// The civil date of a count of days since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

impl DateTime {
    /// The current time in UTC.
    pub fn now_utc() -> DateTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let (year, month, day) = civil_from_days(secs.div_euclid(86400));
        let s = secs.rem_euclid(86400) as u32;
        DateTime {
            year,
            month,
            day,
            hour: s / 3600,
            minute: s / 60 % 60,
            second: s % 60,
        }
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS` (or with a space for `T`, or a date alone: midnight),
    /// refusing anything else or a date that does not exist.
    pub fn parse(text: &str) -> Result<DateTime> {
        let bad = |why: &str| {
            Error::Input(format!(
                "time {text:?}: {why} (expected YYYY-MM-DDTHH:MM:SS, e.g. 2026-12-01T12:00:00)"
            ))
        };
        let (date, time) = match text.split_once(['T', ' ']) {
            Some((d, t)) => (d, Some(t)),
            None => (text, None),
        };
        let number = |s: &str, digits: usize| -> Result<u32> {
            if s.len() != digits || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("not a number of the right width"));
            }
            s.parse().map_err(|_| bad("not a number"))
        };
        let d: Vec<&str> = date.split('-').collect();
        if d.len() != 3 {
            return Err(bad("the date is not YYYY-MM-DD"));
        }
        let (year, month, day) = (number(d[0], 4)? as i64, number(d[1], 2)?, number(d[2], 2)?);
        if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
            return Err(bad("no such date"));
        }
        let (hour, minute, second) = match time {
            None => (0, 0, 0),
            Some(t) => {
                let t: Vec<&str> = t.split(':').collect();
                if t.len() != 3 {
                    return Err(bad("the time is not HH:MM:SS"));
                }
                (number(t[0], 2)?, number(t[1], 2)?, number(t[2], 2)?)
            }
        };
        if hour > 23 || minute > 59 || second > 59 {
            return Err(bad("no such time of day"));
        }
        Ok(DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// 0 = Monday .. 6 = Sunday.
    fn weekday(&self) -> usize {
        // 1970-01-01 was a Thursday (3).
        (days_from_civil(self.year, self.month, self.day) + 3).rem_euclid(7) as usize
    }

    /// 1..=366
    fn day_of_year(&self) -> i64 {
        days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1) + 1
    }

    /// `format` with Python's (C library's) directives: `%Y %y %m %d %e %H %I %M %S %p %B %b
    /// %h %A %a %j %F %T %D %%`, and glibc's `%-d`-style no-padding flag; any other directive
    /// is refused by name.
    pub fn strftime(&self, format: &str) -> Result<String> {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut spec = chars.next();
            let unpadded = spec == Some('-');
            if unpadded {
                spec = chars.next();
            }
            let num = |n: i64, width: usize| {
                if unpadded {
                    n.to_string()
                } else {
                    format!("{n:0width$}")
                }
            };
            let hour12 = if self.hour.is_multiple_of(12) {
                12
            } else {
                self.hour % 12
            };
            let text = match spec {
                Some('Y') => self.year.to_string(),
                Some('y') => num(self.year.rem_euclid(100), 2),
                Some('m') => num(self.month as i64, 2),
                Some('d') => num(self.day as i64, 2),
                Some('e') => format!("{:2}", self.day),
                Some('H') => num(self.hour as i64, 2),
                Some('I') => num(hour12 as i64, 2),
                Some('M') => num(self.minute as i64, 2),
                Some('S') => num(self.second as i64, 2),
                Some('p') => (if self.hour < 12 { "AM" } else { "PM" }).to_string(),
                Some('B') => MONTHS[self.month as usize - 1].to_string(),
                Some('b') | Some('h') => MONTHS[self.month as usize - 1][..3].to_string(),
                Some('A') => WEEKDAYS[self.weekday()].to_string(),
                Some('a') => WEEKDAYS[self.weekday()][..3].to_string(),
                Some('j') => num(self.day_of_year(), 3),
                Some('F') => format!("{}-{:02}-{:02}", self.year, self.month, self.day),
                Some('T') => format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second),
                Some('D') => format!(
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                ),
                Some('%') if !unpadded => "%".to_string(),
                Some(other) => {
                    return Err(Error::Input(format!(
                        "strftime_now: the directive %{}{other} is not supported",
                        if unpadded { "-" } else { "" }
                    )))
                }
                None => {
                    return Err(Error::Input(format!(
                        "strftime_now: format {format:?} ends in a lone %"
                    )))
                }
            };
            out.push_str(&text);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_directives_as_python_formats_them() {
        let t = DateTime::parse("2026-12-01T12:00:00").unwrap();
        // datetime(2026, 12, 1, 12).strftime(...) in Python 3.
        assert_eq!(t.strftime("%Y-%m-%d").unwrap(), "2026-12-01");
        assert_eq!(t.strftime("%d %b %Y").unwrap(), "01 Dec 2026");
        assert_eq!(t.strftime("%B %d, %Y").unwrap(), "December 01, 2026");
        assert_eq!(
            t.strftime("%A %a %j %I%p %-d %%").unwrap(),
            "Tuesday Tue 335 12PM 1 %"
        );
        let leap = DateTime::parse("2024-02-29 23:59:58").unwrap();
        assert_eq!(
            leap.strftime("%A %j %H:%M:%S %y").unwrap(),
            "Thursday 060 23:59:58 24"
        );
        assert_eq!(
            DateTime::parse("1970-01-01")
                .unwrap()
                .strftime("%a")
                .unwrap(),
            "Thu"
        );
        for bad in [
            "2023-02-29T00:00:00",
            "2026-13-01",
            "2026-12-01T24:00:00",
            "x",
            "2026-1-1",
        ] {
            assert!(DateTime::parse(bad).is_err(), "{bad}");
        }
        assert!(t.strftime("%Q").unwrap_err().to_string().contains("%Q"));
        // The round trip through day counts, across eras and leap years.
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert!(d >= 1 && d <= days_in_month(y, m));
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
