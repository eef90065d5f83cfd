//! Owns the calls a guest may make at every step, encoded by hand: the
//! clocks' `now`, the key-value questions and their answers. Each writes
//! the bytes postcard writes for its [`Call`], [`Ask`] or [`Answer`] (a
//! variant is its index, a number a varint, a string or byte vector its
//! length and its bytes), without building the value first; the tests
//! hold each to postcard.
//!
//! **Must not** encode anything postcard would encode otherwise: a
//! record is decoded by postcard.

#![forbid(unsafe_code)]

use super::format::{Answer, Ask, WriteAsk};

/// postcard's unsigned varint: seven bits a byte, low first, the high bit
/// set on every byte but the last.
fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A string or byte vector: its length, then its bytes.
fn bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A bucket's scope, as a string.
fn scope_of(out: &mut Vec<u8>, bucket: &crate::kv::Bucket) {
    let (kind, name) = bucket.scope_parts();
    varint(out, (kind.len() + name.len()) as u64);
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// A key-value question as its host call borrows it: recorded, it is
/// encoded straight from the bucket and key, as its [`Ask`] would be.
pub(crate) enum KvAsk<'a> {
    /// [`Ask::KvGet`].
    Get {
        bucket: &'a crate::kv::Bucket,
        key: &'a str,
    },
    /// [`Ask::KvWrite`].
    Write {
        bucket: &'a crate::kv::Bucket,
        key: &'a str,
        write: WriteAsk,
    },
    /// [`Ask::KvKeys`].
    Keys {
        bucket: &'a crate::kv::Bucket,
        cursor: u64,
    },
}

impl KvAsk<'_> {
    /// Its [`Ask`].
    pub(crate) fn to_ask(&self) -> Ask {
        match self {
            Self::Get { bucket, key } => Ask::KvGet {
                bucket: bucket.scope(),
                key: (*key).to_owned(),
            },
            Self::Write { bucket, key, write } => Ask::KvWrite {
                bucket: bucket.scope(),
                key: (*key).to_owned(),
                write: write.clone(),
            },
            Self::Keys { bucket, cursor } => Ask::KvKeys {
                bucket: bucket.scope(),
                cursor: *cursor,
            },
        }
    }

    /// Appends its [`Ask`]'s encoding to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Get { bucket, key } => {
                out.push(8);
                scope_of(out, bucket);
                bytes(out, key.as_bytes());
            }
            Self::Write { bucket, key, write } => {
                out.push(9);
                scope_of(out, bucket);
                bytes(out, key.as_bytes());
                match write {
                    WriteAsk::Set(value) => {
                        out.push(0);
                        varint(out, *value);
                    }
                    WriteAsk::Delete => out.push(1),
                    WriteAsk::Increment(by) => {
                        out.push(2);
                        varint(out, *by);
                    }
                }
            }
            Self::Keys { bucket, cursor } => {
                out.push(10);
                scope_of(out, bucket);
                varint(out, *cursor);
            }
        }
    }
}

/// Appends `answer`'s encoding to `out`: a key-value read's or write's by
/// hand, any other as postcard writes it.
pub(crate) fn answer(out: &mut Vec<u8>, answer: &Answer) {
    match answer {
        Answer::Value(value) => {
            out.push(6);
            match value {
                Ok(None) => out.extend_from_slice(&[0, 0]),
                Ok(Some(value)) => {
                    out.extend_from_slice(&[0, 1]);
                    bytes(out, value);
                }
                Err(e) => {
                    out.push(1);
                    bytes(out, e.as_bytes());
                }
            }
        }
        Answer::Written(written) => {
            out.push(7);
            match written {
                Ok(None) => out.extend_from_slice(&[0, 0]),
                Ok(Some(n)) => {
                    out.extend_from_slice(&[0, 1]);
                    varint(out, *n);
                }
                Err(e) => {
                    out.push(1);
                    bytes(out, e.as_bytes());
                }
            }
        }
        other => {
            // Encoding plain data into a Vec cannot fail.
            let taken = std::mem::take(out);
            *out = postcard::to_extend(other, taken).unwrap_or_default();
        }
    }
}

/// Appends a clock's call: [`Ask::WallNow`] answered [`Answer::Time`].
pub(crate) fn wall_now(out: &mut Vec<u8>, secs: u64, nanos: u32) {
    out.extend_from_slice(&[0, 0]);
    varint(out, secs);
    varint(out, u64::from(nanos));
}

/// Appends a clock's call: [`Ask::MonotonicNow`] answered
/// [`Answer::Nanos`].
pub(crate) fn monotonic_now(out: &mut Vec<u8>, nanos: u64) {
    out.extend_from_slice(&[2, 1]);
    varint(out, nanos);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::Bucket;
    use crate::record::format::Call;

    #[test]
    fn a_key_value_question_encodes_as_its_ask_does() {
        let long = "k".repeat(300);
        let slot = Bucket::Slot("db".into());
        let shared = Bucket::Shared(format!("team/{}", "n".repeat(200)));
        let asks = [
            KvAsk::Get {
                bucket: &slot,
                key: "a",
            },
            KvAsk::Get {
                bucket: &shared,
                key: &long,
            },
            KvAsk::Write {
                bucket: &slot,
                key: "",
                write: WriteAsk::Set(u64::MAX),
            },
            KvAsk::Write {
                bucket: &shared,
                key: "x",
                write: WriteAsk::Delete,
            },
            KvAsk::Write {
                bucket: &slot,
                key: &long,
                write: WriteAsk::Increment(128),
            },
            KvAsk::Keys {
                bucket: &shared,
                cursor: 0,
            },
            KvAsk::Keys {
                bucket: &slot,
                cursor: 1 << 40,
            },
        ];
        for ask in asks {
            let expected = postcard::to_allocvec(&ask.to_ask()).unwrap();
            let mut direct = Vec::new();
            ask.encode(&mut direct);
            assert_eq!(direct, expected);
        }
    }

    #[test]
    fn a_key_value_answer_encodes_as_postcard_does() {
        let answers = [
            Answer::Value(Ok(None)),
            Answer::Value(Ok(Some(Vec::new()))),
            Answer::Value(Ok(Some(vec![7; 300]))),
            Answer::Value(Err("no".into())),
            Answer::Written(Ok(None)),
            Answer::Written(Ok(Some(0))),
            Answer::Written(Ok(Some(u64::MAX))),
            Answer::Written(Err("quota".repeat(40))),
            Answer::Keys(Ok((vec!["a".into()], Some(3)))),
            Answer::Nanos(5),
        ];
        for a in answers {
            let mut out = vec![1, 2];
            answer(&mut out, &a);
            assert_eq!(out[2..], postcard::to_allocvec(&a).unwrap(), "{a:?}");
            assert_eq!(out[..2], [1, 2]);
        }
    }

    #[test]
    fn a_clock_call_encodes_as_its_call_does() {
        for (secs, nanos) in [(0, 0), (1_765_000_000, 999_999_999), (u64::MAX, u32::MAX)] {
            let call = Call {
                ask: Ask::WallNow,
                answer: Answer::Time(secs, nanos),
            };
            let mut out = Vec::new();
            wall_now(&mut out, secs, nanos);
            assert_eq!(out, postcard::to_allocvec(&call).unwrap());
        }
        for nanos in [0, 127, 128, 1 << 50, u64::MAX] {
            let call = Call {
                ask: Ask::MonotonicNow,
                answer: Answer::Nanos(nanos),
            };
            let mut out = Vec::new();
            monotonic_now(&mut out, nanos);
            assert_eq!(out, postcard::to_allocvec(&call).unwrap());
        }
    }
}
