//! How payloads become kernel inputs and outputs become payloads: the message's own bytes
//! (`PodCodec`, the default) or JSON through serde (`JsonCodec`).

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{DecodeError, EncodeError};

/// Turns payloads into `In` and `Out` into payloads. Shared by every request a worker serves.
pub trait Codec<In, Out>: Send + Sync + 'static {
    /// The kernel input a payload carries.
    fn decode(&self, payload: &[u8]) -> Result<In, DecodeError>;
    /// The payload of an output.
    fn encode(&self, out: &Out) -> Result<Vec<u8>, EncodeError>;
}

/// The message's bytes as they are (`bytemuck::Pod`, native byte order): a payload must be
/// exactly `size_of::<In>()` bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct PodCodec;

impl<In: bytemuck::Pod, Out: bytemuck::Pod> Codec<In, Out> for PodCodec {
    fn decode(&self, payload: &[u8]) -> Result<In, DecodeError> {
        let expected = std::mem::size_of::<In>();
        if payload.len() != expected {
            return Err(DecodeError::WrongSize {
                expected,
                actual: payload.len(),
            });
        }
        // The payload need not be aligned for `In`: read it unaligned.
        Ok(bytemuck::pod_read_unaligned(payload))
    }

    fn encode(&self, out: &Out) -> Result<Vec<u8>, EncodeError> {
        Ok(bytemuck::bytes_of(out).to_vec())
    }
}

/// JSON through serde: a payload parses as `Req` and converts into the kernel's input
/// (`In: TryFrom<Req>`; `Req = In` when the message type derives `Deserialize` itself), an
/// output converts into `Resp` (`Resp: From<Out>`) and is written as JSON.
pub struct JsonCodec<Req, Resp>(PhantomData<fn(Req) -> Resp>);

impl<Req, Resp> JsonCodec<Req, Resp> {
    /// The codec.
    pub fn new() -> Self {
        JsonCodec(PhantomData)
    }
}

impl<Req, Resp> Default for JsonCodec<Req, Resp> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Req, Resp> std::fmt::Debug for JsonCodec<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JsonCodec<{}, {}>",
            std::any::type_name::<Req>(),
            std::any::type_name::<Resp>()
        )
    }
}

impl<In, Out, Req, Resp> Codec<In, Out> for JsonCodec<Req, Resp>
where
    Req: DeserializeOwned + 'static,
    In: TryFrom<Req>,
    <In as TryFrom<Req>>::Error: std::error::Error + Send + Sync + 'static,
    Resp: Serialize + From<Out> + 'static,
    Out: Copy,
{
    fn decode(&self, payload: &[u8]) -> Result<In, DecodeError> {
        let req: Req = serde_json::from_slice(payload).map_err(DecodeError::Json)?;
        In::try_from(req).map_err(|e| DecodeError::Invalid(Box::new(e)))
    }

    fn encode(&self, out: &Out) -> Result<Vec<u8>, EncodeError> {
        serde_json::to_vec(&Resp::from(*out)).map_err(EncodeError::Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_codec_checks_the_size_and_reads_unaligned() {
        let c = PodCodec;
        let bytes = 7.5f64.to_ne_bytes();
        let mut unaligned = [0u8; 9];
        unaligned[1..].copy_from_slice(&bytes);
        let x: f64 = Codec::<f64, f64>::decode(&c, &unaligned[1..]).unwrap();
        assert_eq!(x, 7.5);
        match Codec::<f64, f64>::decode(&c, &bytes[..5]) {
            Err(DecodeError::WrongSize {
                expected: 8,
                actual: 5,
            }) => {}
            other => panic!("expected WrongSize, got {other:?}"),
        }
        assert_eq!(
            Codec::<f64, f64>::encode(&c, &2.0).unwrap(),
            2.0f64.to_ne_bytes()
        );
    }

    #[test]
    fn json_codec_reports_bad_json() {
        let c = JsonCodec::<u32, u32>::new();
        assert_eq!(Codec::<u32, u32>::decode(&c, b"17").unwrap(), 17);
        assert!(matches!(
            Codec::<u32, u32>::decode(&c, b"{\"x\":"),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(
            Codec::<u32, u32>::decode(&c, b"-1"),
            Err(DecodeError::Json(_))
        ));
        assert_eq!(Codec::<u32, u32>::encode(&c, &5).unwrap(), b"5");
    }

    /// Issue 31: serde_json quotes an offending string whole; a 1 MB string payload gave a
    /// 1 MB error reply. The message is now bounded, whatever the payload.
    #[test]
    fn a_json_error_quotes_at_most_a_short_excerpt() {
        let c = JsonCodec::<u32, u32>::new();
        let payload = format!("\"{}é\"", "x".repeat(1 << 20));
        let e = Codec::<u32, u32>::decode(&c, payload.as_bytes()).unwrap_err();
        let text = e.to_string();
        assert!(text.len() <= crate::MAX_QUOTED + 64, "{} bytes", text.len());
        assert!(text.ends_with("..."), "{text}");
        let short = Codec::<u32, u32>::decode(&c, b"\"ab\"")
            .unwrap_err()
            .to_string();
        assert!(
            short.ends_with("expected u32 at line 1 column 4"),
            "{short}"
        );
    }
}
