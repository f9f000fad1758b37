//! Framing shared by journal segments and snapshots:
//! `[u32 LE payload length][u32 LE crc32 of payload][payload]`.
//!
//! The reader never trusts a length before checking it against the bytes the file actually
//! holds, so a corrupt length can neither allocate without bound nor read past the end.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

/// Bytes before each payload: length and crc.
pub(crate) const HEADER: usize = 8;

/// The largest payload the format admits. Anything longer is read as damage ("absurd
/// length"), whatever the append limit was when it was written, so lowering
/// `Options::max_append_bytes` never turns good records into corrupt ones.
pub const MAX_FRAME: u32 = 256 << 20;

/// CRC-32 (IEEE 802.3, reflected: CRC-32/ISO-HDLC, the one zlib and `cksum -o3` use), by
/// `crc32fast`: PCLMULQDQ/SSE4.2 or an 8-byte slice table, ~10x the byte-at-a-time table
/// the store had. The append path is fsync-bound, but a restart checks every byte of the
/// snapshot and journal, and there it was the largest cost (100k tasks: ~100 MB).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// Appends one frame holding `payload` to `out`.
pub(crate) fn push_frame(out: &mut Vec<u8>, payload: &[u8]) {
    debug_assert!(!payload.is_empty() && payload.len() <= MAX_FRAME as usize);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Why the bytes at some offset are not a good frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Fewer than the 8 header bytes remain.
    ShortHeader { have: u64 },
    /// A zero length: never written (payloads are non-empty), typically a zero-filled tail
    /// left by a crash after the file grew but before its data reached the disk. Checked
    /// explicitly because crc32 of nothing is 0, so zeros would otherwise pass the crc.
    ZeroLength,
    /// A length above [`MAX_FRAME`].
    AbsurdLength { len: u32 },
    /// A length that runs past the end of the file (a torn write).
    PastEof { len: u32, have: u64 },
    /// The payload does not match its crc.
    BadCrc { stored: u32, computed: u32 },
    /// The crc matched but the payload is not what the format says (bad JSON, wrong shape).
    BadPayload(String),
    /// The file ends at a frame boundary before the end its batch header announced.
    ShortBatch { missing: u64 },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::ShortHeader { have } => write!(f, "short frame header ({have} of 8 bytes)"),
            Damage::ZeroLength => f.write_str("zero-length frame (zero-filled tail)"),
            Damage::AbsurdLength { len } => {
                write!(f, "absurd frame length {len} (format limit {MAX_FRAME})")
            }
            Damage::PastEof { len, have } => {
                write!(
                    f,
                    "frame length {len} runs past end of file ({have} bytes left)"
                )
            }
            Damage::BadCrc { stored, computed } => {
                write!(
                    f,
                    "crc mismatch (stored {stored:08x}, computed {computed:08x})"
                )
            }
            Damage::BadPayload(why) => write!(f, "bad payload: {why}"),
            Damage::ShortBatch { missing } => {
                write!(
                    f,
                    "the file ends {missing} bytes before the end of its batch"
                )
            }
        }
    }
}

/// What [`FrameReader::next`] found.
pub(crate) enum Next {
    /// A good frame starting at `offset`.
    Frame { offset: u64, payload: Vec<u8> },
    /// Clean end of file.
    End,
    /// Damage at `offset`; the reader stops there.
    Bad { offset: u64, damage: Damage },
}

/// Reads frames from a file of known length.
pub(crate) struct FrameReader<R> {
    r: R,
    offset: u64,
    len: u64,
}

impl<R: Read> FrameReader<R> {
    pub(crate) fn new(r: R, len: u64) -> Self {
        FrameReader { r, offset: 0, len }
    }

    /// Where the next frame starts (after damage: where the damaged one did).
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    pub(crate) fn next(&mut self) -> io::Result<Next> {
        let offset = self.offset;
        let left = self.len - offset;
        if left == 0 {
            return Ok(Next::End);
        }
        let bad = |damage| Ok(Next::Bad { offset, damage });
        if left < HEADER as u64 {
            return bad(Damage::ShortHeader { have: left });
        }
        let mut h = [0u8; HEADER];
        self.r.read_exact(&mut h)?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let stored = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if len == 0 {
            return bad(Damage::ZeroLength);
        }
        if len > MAX_FRAME {
            return bad(Damage::AbsurdLength { len });
        }
        let have = left - HEADER as u64;
        if u64::from(len) > have {
            return bad(Damage::PastEof { len, have });
        }
        let mut payload = vec![0u8; len as usize];
        self.r.read_exact(&mut payload)?;
        let computed = crc32(&payload);
        if computed != stored {
            return bad(Damage::BadCrc { stored, computed });
        }
        self.offset += HEADER as u64 + u64::from(len);
        Ok(Next::Frame { offset, payload })
    }
}

/// The first frame starting after `from` that is whole, matches its crc, has a payload
/// beginning with one of `prefixes`, and that `accept` takes; recovery uses it to learn
/// whether good data follows a damaged frame. Resynchronising on the payload's first bytes
/// keeps this linear: inside a JSON payload no offset can pass for a frame start, because
/// JSON text never holds a byte below 0x20 and so reads as a length above [`MAX_FRAME`].
pub(crate) fn find_frame(
    file: &File,
    len: u64,
    from: u64,
    prefixes: &[&[u8]],
    mut accept: impl FnMut(&[u8]) -> bool,
) -> io::Result<Option<u64>> {
    const CHUNK: usize = 1 << 20;
    let longest = prefixes.iter().map(|p| p.len()).max().unwrap_or(0);
    // Each read covers CHUNK candidate starts plus what is needed to test the last of them.
    let window = CHUNK + HEADER + longest;
    let mut buf = Vec::new();
    let mut at = from;
    while len.saturating_sub(at) > HEADER as u64 {
        let n = (len - at).min(window as u64) as usize;
        buf.resize(n, 0);
        file.read_exact_at(&mut buf, at)?;
        let starts = if n < window { n - HEADER } else { CHUNK };
        for i in 0..starts {
            let body = &buf[i + HEADER..];
            if !prefixes.iter().any(|p| body.starts_with(p)) {
                continue;
            }
            let start = at + i as u64;
            let h = &buf[i..i + HEADER];
            let size = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let stored = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            if size == 0 || size > MAX_FRAME || start + (HEADER as u64) + u64::from(size) > len {
                continue;
            }
            let mut payload = vec![0u8; size as usize];
            file.read_exact_at(&mut payload, start + HEADER as u64)?;
            if crc32(&payload) == stored && accept(&payload) {
                return Ok(Some(start));
            }
        }
        at += starts as u64;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    /// The crc the store wrote before `crc32fast` (bit by bit, the same polynomial), so
    /// every existing file still reads: equal on lengths around each of its fast paths'
    /// block sizes, and on unaligned starts.
    #[test]
    fn crc32_is_the_one_existing_stores_hold() {
        fn bitwise(data: &[u8]) -> u32 {
            let mut c = !0u32;
            for &b in data {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        0xEDB8_8320 ^ (c >> 1)
                    } else {
                        c >> 1
                    };
                }
            }
            !c
        }
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..8 {
            for len in (0..300).chain([511, 512, 513, 1023, 1024, 1025, 4000]) {
                let d = &data[start..(start + len).min(data.len())];
                assert_eq!(crc32(d), bitwise(d), "start {start}, len {len}");
            }
        }
    }

    fn read_all(bytes: &[u8]) -> (Vec<Vec<u8>>, Option<(u64, Damage)>) {
        let mut r = FrameReader::new(bytes, bytes.len() as u64);
        let mut out = Vec::new();
        loop {
            match r.next().unwrap() {
                Next::Frame { payload, .. } => out.push(payload),
                Next::End => return (out, None),
                Next::Bad { offset, damage } => return (out, Some((offset, damage))),
            }
        }
    }

    #[test]
    fn frames_round_trip_and_damage_is_named() {
        let mut buf = Vec::new();
        push_frame(&mut buf, b"one");
        push_frame(&mut buf, b"two!");
        assert_eq!(
            read_all(&buf),
            (vec![b"one".to_vec(), b"two!".to_vec()], None)
        );

        let first = (HEADER + 3) as u64;
        let (_, d) = read_all(&buf[..buf.len() - 1]);
        assert_eq!(d, Some((first, Damage::PastEof { len: 4, have: 3 })));
        let (_, d) = read_all(&buf[..first as usize + 5]);
        assert_eq!(d, Some((first, Damage::ShortHeader { have: 5 })));

        let mut zeros = buf.clone();
        zeros.extend_from_slice(&[0u8; 64]);
        let (frames, d) = read_all(&zeros);
        assert_eq!(frames.len(), 2);
        assert_eq!(d.unwrap().1, Damage::ZeroLength);

        let mut flipped = buf.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(read_all(&flipped).1, Some((o, Damage::BadCrc { .. })) if o == first));

        let mut huge = buf.clone();
        huge[first as usize + 3] = 0xff;
        assert!(matches!(
            read_all(&huge).1,
            Some((_, Damage::AbsurdLength { .. }))
        ));
    }

    /// `find_frame` reads in windows of 1 MiB: frames whose header or payload prefix
    /// straddle a window's end are found all the same, as is one ending the file, and text
    /// that merely looks like a payload start is passed over.
    #[test]
    fn find_frame_sees_across_its_read_windows() {
        const MIB: usize = 1 << 20;
        let path = std::env::temp_dir().join(format!("agentd-find-frame-{}", std::process::id()));
        let prefix: &[u8] = b"{\"batch\":";
        let mut frame = Vec::new();
        push_frame(&mut frame, b"{\"batch\":7,\"bytes\":0}");
        let size = 2 * MIB + 100;
        let find = |from: u64, accept: fn(&[u8]) -> bool| {
            let file = File::open(&path).unwrap();
            find_frame(&file, size as u64, from, &[b"[x", prefix], accept).unwrap()
        };
        let mut places = vec![0, 5, MIB - 9, MIB - 8, MIB - 3, MIB, MIB + 1, 2 * MIB - 4];
        places.push(size - frame.len());
        for at in places {
            // A decoy first: the prefix inside text, where no frame header can stand.
            let mut bytes = b"{\"a\":{\"batch\":1}}".repeat(size / 17 + 1);
            bytes.truncate(size);
            bytes[at..at + frame.len()].copy_from_slice(&frame);
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(find(0, |_| true), Some(at as u64), "frame at {at}");
            assert_eq!(find(at as u64, |_| true), Some(at as u64), "frame at {at}");
            assert_eq!(find(at as u64 + 1, |_| true), None, "frame at {at}");
            assert_eq!(find(0, |_| false), None, "refused by accept, at {at}");
        }
        let _ = std::fs::remove_file(&path);
    }
}
