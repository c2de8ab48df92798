//! pkt-line framing (git's wire format) and side-band demultiplexing.

use super::{Error, Framing};

/// Append one pkt-line holding `data`.
pub fn write(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:04x}", data.len() + 4).as_bytes());
    out.extend_from_slice(data);
}

pub fn flush(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0000");
}

/// Protocol v2's delimiter between a command's capabilities and its arguments.
pub fn delim(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0001");
}

/// One frame of a pkt-line stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data(&'a [u8]),
    Flush,
    /// `0001` (delimiter) and `0002` (response end) of protocol v2; tolerated, never expected.
    Special,
}

/// Reads pkt-lines from a buffered response.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// The next frame, or `None` at the end of the input.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'a>>, Error> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let head = self
            .buf
            .get(..4)
            .ok_or(Error::Framing(Framing::TruncatedHeader))?;
        let len = std::str::from_utf8(head)
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| {
                Error::Framing(Framing::BadLength(
                    String::from_utf8_lossy(head).into_owned(),
                ))
            })?;
        match len {
            0 => {
                self.buf = &self.buf[4..];
                Ok(Some(Frame::Flush))
            }
            1 | 2 => {
                self.buf = &self.buf[4..];
                Ok(Some(Frame::Special))
            }
            3 => Err(Error::Framing(Framing::LengthThree)),
            n => {
                let data = self
                    .buf
                    .get(4..n)
                    .ok_or(Error::Framing(Framing::Truncated))?;
                self.buf = &self.buf[n..];
                Ok(Some(Frame::Data(data)))
            }
        }
    }

    /// The next data line with a trailing LF removed; `None` at a flush or the end.
    pub fn next_line(&mut self) -> Result<Option<&'a [u8]>, Error> {
        match self.next_frame()? {
            Some(Frame::Data(d)) => Ok(Some(d.strip_suffix(b"\n").unwrap_or(d))),
            Some(Frame::Flush | Frame::Special) | None => Ok(None),
        }
    }

    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
}

/// Collect side-band channel 1 until a flush or the end; channel 2 is progress (dropped), channel
/// 3 a fatal error from the remote.
pub fn demux(reader: &mut Reader<'_>, first: Option<&[u8]>) -> Result<Vec<u8>, Error> {
    let mut data = Vec::new();
    let mut handle = |frame: &[u8]| -> Result<(), Error> {
        match frame.split_first() {
            Some((1, payload)) => data.extend_from_slice(payload),
            Some((2, _)) => {}
            Some((3, message)) => {
                return Err(Error::SideBand(
                    String::from_utf8_lossy(message).trim().to_owned(),
                ));
            }
            _ => {
                return Err(Error::Framing(Framing::NoChannel));
            }
        }
        Ok(())
    };
    if let Some(frame) = first {
        handle(frame)?;
    }
    while let Some(frame) = reader.next_frame()? {
        match frame {
            Frame::Data(d) => handle(d)?,
            Frame::Flush | Frame::Special => break,
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        write(&mut out, b"hello\n");
        flush(&mut out);
        write(&mut out, b"x");
        assert_eq!(out, b"000ahello\n00000005x");
        let mut r = Reader::new(&out);
        assert_eq!(r.next_line().expect("ok"), Some(&b"hello"[..]));
        assert_eq!(r.next_frame().expect("ok"), Some(Frame::Flush));
        assert_eq!(r.next_frame().expect("ok"), Some(Frame::Data(b"x")));
        assert_eq!(r.next_frame().expect("ok"), None);
    }

    #[test]
    fn refuses_garbage() {
        for bad in [&b"00"[..], b"zzzz", b"0003", b"0009abc"] {
            assert!(Reader::new(bad).next_frame().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn demux_channels() {
        let mut out = Vec::new();
        write(&mut out, b"\x01PA");
        write(&mut out, b"\x02progress");
        write(&mut out, b"\x01CK");
        flush(&mut out);
        assert_eq!(demux(&mut Reader::new(&out), None).expect("ok"), b"PACK");
        let mut err = Vec::new();
        write(&mut err, b"\x03boom");
        assert!(
            matches!(demux(&mut Reader::new(&err), None), Err(Error::SideBand(m)) if m == "boom")
        );
    }
}
