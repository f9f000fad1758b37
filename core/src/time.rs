//! Time as the core sees it: the driver hands in [`Now`]; the core never reads a clock.
//! Also the two text forms the wire needs: RFC 3339 (`google.protobuf.Timestamp`) and the
//! HTTP `Date` header.

/// The two readings the driver takes each time it calls into the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Now {
    /// Monotonic milliseconds since an origin the driver chooses; deadlines use these.
    pub mono_ms: u64,
    /// Wall-clock milliseconds since the Unix epoch; timestamps on the wire use these.
    pub epoch_ms: u64,
}

impl Now {
    /// Both readings, taken together by the driver.
    pub const fn new(mono_ms: u64, epoch_ms: u64) -> Self {
        Now { mono_ms, epoch_ms }
    }
}

/// Days since 1970-01-01 → (year, month, day); Howard Hinnant's civil-from-days.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `2026-01-01T00:00:00.000Z`: UTC, millisecond precision, as the A2A spec asks.
pub(crate) fn rfc3339_ms(epoch_ms: u64) -> String {
    let secs = (epoch_ms / 1000) as i64;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let (h, mi, se, ms) = (sod / 3600, (sod / 60) % 60, sod % 60, epoch_ms % 1000);
    if !(0..=9999).contains(&y) {
        return format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{se:02}.{ms:03}Z");
    }
    // Digit by digit into a fixed buffer: every task's status on every listed page has a
    // timestamp, and `format!` was a tenth of a ListTasks answer's CPU.
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, y as u64);
    put(5, 2, u64::from(mo));
    put(8, 2, u64::from(d));
    put(11, 2, h as u64);
    put(14, 2, mi as u64);
    put(17, 2, se as u64);
    put(20, 3, ms);
    // Digits and ASCII punctuation only.
    String::from(std::str::from_utf8(&out).unwrap_or_default())
}

/// Parses an RFC 3339 timestamp (`Z` or a numeric offset, 0–9 fractional digits) into epoch
/// milliseconds. Sub-millisecond digits are truncated. `None` for anything malformed or
/// before 1970.
pub(crate) fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: core::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d == 0 || d > 31 || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms: u64 = 0;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                ms = ms * 10 + u64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 9 {
            return None;
        }
        for _ in digits..3 {
            ms *= 10;
        }
    }
    let offset_s: i64 = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = i64::from(num(i + 1..i + 3)?);
            let om = i64::from(num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(se) - offset_s;
    if secs < 0 {
        return None;
    }
    Some(secs as u64 * 1000 + ms)
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 IMF-fixdate).
pub(crate) fn http_date(epoch_ms: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = (epoch_ms / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let sod = secs.rem_euclid(86_400);
    format!(
        "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[(mo - 1) as usize],
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_767_225_600_123), "2026-01-01T00:00:00.123Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(http_date(784_111_777_000), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    /// The digit-by-digit form writes what `format!` writes, over a spread of instants
    /// (every field's carries, leap days, the last millisecond of 9999 and past it).
    #[test]
    fn formats_as_format_would() {
        let by_format = |epoch_ms: u64| {
            let secs = (epoch_ms / 1000) as i64;
            let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
            let sod = secs.rem_euclid(86_400);
            format!(
                "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
                sod / 3600,
                (sod / 60) % 60,
                sod % 60,
                epoch_ms % 1000
            )
        };
        // An odd stride over about 8,000 years: every month, hour and millisecond digit.
        for i in 0..100_000u64 {
            let ms = i * 2_600_000_017_777;
            assert_eq!(rfc3339_ms(ms), by_format(ms), "{ms}");
        }
        for ms in [253_402_300_799_999, 253_402_300_800_000, u64::MAX] {
            assert_eq!(rfc3339_ms(ms), by_format(ms), "{ms}");
        }
        assert_eq!(rfc3339_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn parses_what_it_writes_and_the_spec_variants() {
        for ms in [
            0u64,
            1,
            999,
            1_767_225_600_123,
            4_102_444_800_000,
            951_868_799_999,
        ] {
            assert_eq!(parse_rfc3339(&rfc3339_ms(ms)), Some(ms));
        }
        assert_eq!(
            parse_rfc3339("2026-01-01T00:00:00Z"),
            Some(1_767_225_600_000)
        );
        assert_eq!(
            parse_rfc3339("2026-01-01T00:00:00.123456789Z"),
            Some(1_767_225_600_123)
        );
        assert_eq!(
            parse_rfc3339("2026-01-01T01:00:00+01:00"),
            Some(1_767_225_600_000)
        );
        for bad in [
            "",
            "2026-01-01",
            "2026-13-01T00:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00.1234567890Z",
            "2026-01-01T00:00:00Zx",
            "1969-12-31T23:59:59Z",
            "2026-01-01T00:00:00+1:00",
            "२०२६-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
