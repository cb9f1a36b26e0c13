//! The wire protocol: one ZeroMQ frame per message, authenticated with HMAC-SHA256.
//!
//! ```text
//! offset  size  field
//! 0       4     magic "ABRZ"
//! 4       1     protocol version (1)
//! 5       1     kind: 1 join, 4 abort (participant -> coordinator); 2 result, 3 failure
//! 6       2     reserved, 0
//! 8       8     round, little-endian (1 for the first exchange)
//! 16      4     participant index
//! 20      4     world size the sender expects
//! 24      2     job id length J, then J bytes of job id (UTF-8)
//! 26+J    4     payload length P, then P bytes of payload
//! ...     32    HMAC-SHA256 over every byte before it, keyed with the job's secret
//! ```
//!
//! Both directions are authenticated, so a participant cannot be fed a forged table either.
//! Integers are little-endian. Anything that does not decode exactly is refused with a reason;
//! the cheap structural checks come before the HMAC, so garbage costs little to refuse.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The frame's first bytes.
pub const MAGIC: &[u8; 4] = b"ABRZ";
/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of the HMAC tag at the end of a frame.
const TAG_LEN: usize = 32;
/// Bytes before the job id.
const FIXED_LEN: usize = 26;
/// The longest job id, in bytes.
pub const MAX_JOB_ID: usize = 255;

type HmacSha256 = Hmac<Sha256>;

/// The shared secret of one job: 32 random bytes. Its `Debug` output never shows it, and
/// comparing two takes the same time wherever they differ.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl Eq for Secret {}

impl Secret {
    /// A secret from the operating system's random source.
    ///
    /// # Errors
    ///
    /// The I/O error if `/dev/urandom` cannot be read.
    pub fn random() -> std::io::Result<Secret> {
        use std::io::Read;
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(Secret(bytes))
    }

    /// A secret from its 64-character hexadecimal form (how it travels on a pipe or in a
    /// variable), or `None` if `text` is not that.
    pub fn from_hex(text: &str) -> Option<Secret> {
        let text = text.trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Secret(bytes))
    }

    /// The 64-character hexadecimal form.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A secret from raw bytes (tests and benchmarks).
    pub fn from_bytes(bytes: [u8; 32]) -> Secret {
        Secret(bytes)
    }

    /// A key derived from `text` (its SHA-256). Everyone who knows the text has the key: it
    /// keeps jobs that agree on a text apart, but is no secret unless the text is one.
    pub fn derive(text: &str) -> Secret {
        use sha2::Digest;
        Secret(Sha256::digest(text.as_bytes()).into())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail for 32 bytes.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC-SHA256 takes a 32-byte key"),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A participant's contribution to a round.
    Join = 1,
    /// The coordinator's answer to a completed round.
    Result = 2,
    /// The coordinator's report that the rendezvous failed; the payload is the reason (UTF-8).
    Failure = 3,
    /// A participant gave up waiting; the payload is why. The coordinator fails the round for
    /// everyone, so no participant fails alone while the others succeed.
    Abort = 4,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What it is.
    pub kind: Kind,
    /// The round it belongs to.
    pub round: u64,
    /// The participant it is from (join) or for (result, failure).
    pub index: u32,
    /// The world size its sender expects.
    pub world: u32,
    /// The job it belongs to.
    pub job_id: &'a str,
    /// The payload.
    pub payload: &'a [u8],
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Shorter than any frame, or lengths that do not add up.
    Malformed(&'static str),
    /// Not an atlasboost frame at all.
    BadMagic,
    /// A protocol version this build does not speak.
    Version(u8),
    /// An unknown kind byte.
    Kind(u8),
    /// The HMAC does not match: a wrong or missing secret, or a corrupted frame.
    Authentication,
    /// Authentic, but for another job.
    OtherJob(String),
    /// Larger than the size limit.
    TooLarge(usize),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Malformed(why) => write!(f, "malformed frame ({why})"),
            Refused::BadMagic => f.write_str("not an atlasboost frame"),
            Refused::Version(v) => write!(f, "protocol version {v}, this build speaks {VERSION}"),
            Refused::Kind(k) => write!(f, "unknown frame kind {k}"),
            Refused::Authentication => {
                f.write_str("authentication failed (wrong or missing secret)")
            }
            Refused::OtherJob(job) => write!(f, "frame of another job ({job:?})"),
            Refused::TooLarge(n) => write!(f, "frame of {n} bytes is over the size limit"),
        }
    }
}

/// Encodes and signs a frame.
pub fn encode(secret: &Secret, frame: &Frame<'_>) -> Vec<u8> {
    let job = frame.job_id.as_bytes();
    let mut out = Vec::with_capacity(FIXED_LEN + job.len() + 4 + frame.payload.len() + TAG_LEN);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(frame.kind as u8);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&frame.round.to_le_bytes());
    out.extend_from_slice(&frame.index.to_le_bytes());
    out.extend_from_slice(&frame.world.to_le_bytes());
    // Configurations refuse job ids over MAX_JOB_ID bytes, so the length fits.
    out.extend_from_slice(&(job.len() as u16).to_le_bytes());
    out.extend_from_slice(job);
    out.extend_from_slice(&(frame.payload.len() as u32).to_le_bytes());
    out.extend_from_slice(frame.payload);
    let mut mac = secret.mac();
    mac.update(&out);
    out.extend_from_slice(&mac.finalize().into_bytes());
    out
}

/// Checks and decodes a frame: size, magic, version, HMAC (in constant time), then the job.
///
/// # Errors
///
/// [`Refused`] with the reason, for the coordinator's log.
pub fn decode<'a>(
    secret: &Secret,
    job_id: &str,
    max_len: usize,
    bytes: &'a [u8],
) -> Result<Frame<'a>, Refused> {
    if bytes.len() > max_len {
        return Err(Refused::TooLarge(bytes.len()));
    }
    if bytes.len() < FIXED_LEN + 4 + TAG_LEN {
        return Err(if bytes.starts_with(MAGIC) || bytes.len() < MAGIC.len() {
            Refused::Malformed("too short")
        } else {
            Refused::BadMagic
        });
    }
    if &bytes[..4] != MAGIC {
        return Err(Refused::BadMagic);
    }
    if bytes[4] != VERSION {
        return Err(Refused::Version(bytes[4]));
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);

    let kind = match body[5] {
        1 => Kind::Join,
        2 => Kind::Result,
        3 => Kind::Failure,
        4 => Kind::Abort,
        k => return Err(Refused::Kind(k)),
    };
    if body[6] != 0 || body[7] != 0 {
        return Err(Refused::Malformed("reserved bytes are not zero"));
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
    let mut round = [0u8; 8];
    round.copy_from_slice(&body[8..16]);
    let job_len = usize::from(u16::from_le_bytes([body[24], body[25]]));
    let job_end = FIXED_LEN + job_len;
    if body.len() < job_end + 4 {
        return Err(Refused::Malformed("job id longer than the frame"));
    }
    let frame_job = std::str::from_utf8(&body[FIXED_LEN..job_end])
        .map_err(|_| Refused::Malformed("job id is not UTF-8"))?;
    let payload_len = u32_at(job_end) as usize;
    let payload = &body[job_end + 4..];
    if payload.len() != payload_len {
        return Err(Refused::Malformed(
            "payload length does not match the frame",
        ));
    }
    // The frame is well formed: now the (costlier) signature, then whose job it is.
    let mut mac = secret.mac();
    mac.update(body);
    mac.verify_slice(tag).map_err(|_| Refused::Authentication)?;
    if frame_job != job_id {
        return Err(Refused::OtherJob(frame_job.to_string()));
    }
    Ok(Frame {
        kind,
        round: u64::from_le_bytes(round),
        index: u32_at(16),
        world: u32_at(20),
        job_id: frame_job,
        payload,
    })
}

/// Packs a list of payloads into one: a count, then each length and its bytes (all u32 LE).
pub fn pack_list(items: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = items.iter().map(|i| 4 + i.len()).sum();
    let mut out = Vec::with_capacity(4 + total);
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for i in items {
        out.extend_from_slice(&(i.len() as u32).to_le_bytes());
        out.extend_from_slice(i);
    }
    out
}

/// Unpacks [`pack_list`]; `None` if the bytes are not such a list.
pub fn unpack_list(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let read_u32 = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = read_u32(0)?;
    // Each item takes at least 4 bytes: a count beyond that is a lie, not an allocation.
    if count > bytes.len() / 4 {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    let mut at = 4;
    for _ in 0..count {
        let len = read_u32(at)?;
        at += 4;
        out.push(bytes.get(at..at.checked_add(len)?)?.to_vec());
        at += len;
    }
    (at == bytes.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> Secret {
        Secret::from_bytes([b; 32])
    }

    fn frame(payload: &[u8]) -> Frame<'_> {
        Frame {
            kind: Kind::Join,
            round: 7,
            index: 3,
            world: 8,
            job_id: "job-1",
            payload,
        }
    }

    #[test]
    fn frames_round_trip() {
        let bytes = encode(&secret(1), &frame(b"hello"));
        assert_eq!(
            decode(&secret(1), "job-1", 1 << 20, &bytes),
            Ok(frame(b"hello"))
        );
        let empty = encode(&secret(1), &frame(b""));
        assert_eq!(decode(&secret(1), "job-1", 1 << 20, &empty), Ok(frame(b"")));
    }

    #[test]
    fn every_kind_of_bad_frame_is_refused_with_its_reason() {
        let good = encode(&secret(1), &frame(b"hello"));
        fn d(bytes: &[u8]) -> Result<Frame<'_>, Refused> {
            decode(&secret(1), "job-1", 1 << 20, bytes)
        }
        assert_eq!(
            decode(&secret(2), "job-1", 1 << 20, &good),
            Err(Refused::Authentication)
        );
        assert_eq!(
            decode(&secret(1), "job-2", 1 << 20, &good),
            Err(Refused::OtherJob("job-1".into()))
        );
        assert_eq!(
            decode(&secret(1), "job-1", 10, &good),
            Err(Refused::TooLarge(good.len()))
        );
        assert_eq!(
            d(b"garbage garbage garbage garbage garbage garbage garbage garbage"),
            Err(Refused::BadMagic)
        );
        assert_eq!(d(b"AB"), Err(Refused::Malformed("too short")));
        let mut future = good.clone();
        future[4] = 9;
        assert_eq!(d(&future), Err(Refused::Version(9)));
        let mut flipped = good.clone();
        flipped[30] ^= 1;
        assert_eq!(d(&flipped), Err(Refused::Authentication));
        let mut unsigned = good.clone();
        unsigned.truncate(good.len() - 32);
        assert!(d(&unsigned).is_err());
    }

    #[test]
    fn secrets_travel_as_hex_and_never_print() {
        let s = Secret::random().unwrap();
        assert_eq!(Secret::from_hex(&s.to_hex()), Some(s.clone()));
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(Secret::from_hex("zz"), None);
        assert_eq!(Secret::from_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn lists_round_trip_and_lies_are_refused() {
        let items = vec![b"a".to_vec(), Vec::new(), vec![7; 300]];
        assert_eq!(unpack_list(&pack_list(&items)), Some(items));
        assert_eq!(unpack_list(&[255, 255, 255, 255]), None);
        assert_eq!(unpack_list(&[1, 0, 0, 0, 9, 0, 0, 0, 1]), None);
        assert_eq!(unpack_list(&[]), None);
    }
}
