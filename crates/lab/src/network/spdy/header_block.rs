//! SPDY/3 header blocks: name/value pairs to bytes and back, and the zlib stream each
//! direction of a session compresses its blocks with (one stream per direction, with
//! SPDY/3's dictionary).

use bytes::{Buf, BufMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::frame::{FrameError, MAX_HEADER_BLOCK};

/// The SPDY/3 header-compression dictionary (SPDY/3 draft §2.6.10.1), as spdystream has it.
pub static DICTIONARY: &[u8] = include_bytes!("spdy3_dictionary.bin");

/// The zlib id (Adler-32) of [`DICTIONARY`], which a peer's header stream names.
const DICTIONARY_ID: u32 = 0xe3c6_a7c2;

/// An uncompressed header block: the number of pairs, then each name and value with its
/// length (32 bits each). Names are lowercased; several values of a name go NUL-separated.
pub fn encode_header_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut names: Vec<(String, Vec<&str>)> = Vec::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        match names.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => names.push((name, vec![value])),
        }
    }
    let mut block = Vec::new();
    block.put_u32(names.len() as u32);
    for (name, values) in names {
        let value = values.join("\0");
        block.put_u32(name.len() as u32);
        block.put_slice(name.as_bytes());
        block.put_u32(value.len() as u32);
        block.put_slice(value.as_bytes());
    }
    block
}

/// The name/value pairs of an uncompressed header block, a pair per value.
pub fn decode_header_block(mut block: &[u8]) -> Result<Vec<(String, String)>, FrameError> {
    fn chunk<'a>(block: &mut &'a [u8]) -> Result<&'a [u8], FrameError> {
        if block.len() < 4 {
            return Err(FrameError::HeaderBlock);
        }
        let length = block.get_u32() as usize;
        if block.len() < length {
            return Err(FrameError::HeaderBlock);
        }
        let (chunk, rest) = block.split_at(length);
        *block = rest;
        Ok(chunk)
    }
    if block.len() < 4 {
        return Err(FrameError::HeaderBlock);
    }
    let count = block.get_u32();
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = std::str::from_utf8(chunk(&mut block)?).map_err(|_| FrameError::HeaderBlock)?;
        let value = chunk(&mut block)?;
        if name.is_empty() {
            return Err(FrameError::HeaderBlock);
        }
        for value in value.split(|b| *b == 0) {
            let value = String::from_utf8_lossy(value).into_owned();
            headers.push((name.to_ascii_lowercase(), value));
        }
    }
    Ok(headers)
}

/// The compressing side of a session's header stream: one zlib stream with the SPDY/3
/// dictionary, each block ending at a sync flush (as Go's framer writes them).
pub struct HeaderCompressor(Compress);

impl Default for HeaderCompressor {
    fn default() -> Self {
        let mut zlib = Compress::new(Compression::best(), true);
        // A fresh stream always takes a dictionary.
        zlib.set_dictionary(DICTIONARY)
            .expect("a new zlib stream takes a dictionary");
        HeaderCompressor(zlib)
    }
}

impl HeaderCompressor {
    /// `block` compressed, ready for a frame; the stream carries on for the next block.
    pub fn compress(&mut self, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(block.len() / 2 + 64);
        let start = self.0.total_in();
        loop {
            let consumed = (self.0.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            // Compressing into memory cannot fail: the stream is ours and never finished.
            let _ = self
                .0
                .compress_vec(&block[consumed..], &mut out, FlushCompress::Sync);
            // The flush is complete once all input is in and output space is left over.
            let all_in = (self.0.total_in() - start) as usize == block.len();
            if all_in && out.len() < out.capacity() {
                return out;
            }
        }
    }
}

/// The decompressing side of a session's header stream.
pub struct HeaderDecompressor(Decompress);

impl Default for HeaderDecompressor {
    fn default() -> Self {
        HeaderDecompressor(Decompress::new(true))
    }
}

impl HeaderDecompressor {
    /// The uncompressed header block of the next frame, `compressed` being its whole block.
    pub fn decompress(&mut self, compressed: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::with_capacity(compressed.len() * 4 + 64);
        let start = self.0.total_in();
        loop {
            let consumed = (self.0.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(FrameError::HeaderBlockTooLarge);
                }
                out.reserve(out.capacity().max(256));
            }
            let (before_in, before_out) = (self.0.total_in(), self.0.total_out());
            match self
                .0
                .decompress_vec(&compressed[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(DICTIONARY_ID) => {
                        self.0
                            .set_dictionary(DICTIONARY)
                            .map_err(|e| FrameError::Compression(e.to_string()))?;
                        continue;
                    }
                    Some(other) => return Err(FrameError::Dictionary(other)),
                    None => return Err(FrameError::Compression(e.to_string())),
                },
            }
            let all_in = (self.0.total_in() - start) as usize == compressed.len();
            if all_in && out.len() < out.capacity() {
                break;
            }
            let progressed = self.0.total_in() != before_in || self.0.total_out() != before_out;
            if !progressed && out.len() < out.capacity() {
                // Input left that zlib will not take: the block ends mid-stream.
                return Err(FrameError::Compression("truncated header block".into()));
            }
        }
        if out.len() > MAX_HEADER_BLOCK {
            return Err(FrameError::HeaderBlockTooLarge);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::spdy::test_client::pairs;

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        let mut check = flate2::Decompress::new(true);
        // The zlib header Go writes names the dictionary by its Adler-32: a stream of
        // ours with it set must name the same id.
        let mut c = HeaderCompressor::default();
        let out = c.compress(b"x");
        let id = u32::from_be_bytes([out[2], out[3], out[4], out[5]]);
        assert_eq!(id, DICTIONARY_ID);
        assert_eq!(adler32(DICTIONARY), DICTIONARY_ID);
        let mut sink = Vec::with_capacity(16);
        let e = check
            .decompress_vec(&out, &mut sink, FlushDecompress::Sync)
            .unwrap_err();
        assert_eq!(e.needs_dictionary(), Some(DICTIONARY_ID));
    }

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for byte in data {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        b << 16 | a
    }

    #[test]
    fn header_blocks_share_one_zlib_stream_each_way() {
        let first = pairs(&[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestid", "0"),
        ]);
        let second = pairs(&[
            ("streamtype", "data"),
            ("port", "8080"),
            ("requestid", "0"),
            ("x-many", "a"),
            ("x-many", "b"),
        ]);
        let mut compressor = HeaderCompressor::default();
        let mut decompressor = HeaderDecompressor::default();
        let one = compressor.compress(&encode_header_block(&first));
        let two = compressor.compress(&encode_header_block(&second));
        // The second block relies on the first: alone, it is not a zlib stream.
        assert!(HeaderDecompressor::default().decompress(&two).is_err());
        let got = decode_header_block(&decompressor.decompress(&one).unwrap()).unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("streamtype", "error"),
                ("port", "8080"),
                ("requestid", "0")
            ])
        );
        let got = decode_header_block(&decompressor.decompress(&two).unwrap()).unwrap();
        assert_eq!(got, second);
    }

    #[test]
    fn a_header_block_too_large_once_decompressed_is_refused() {
        let huge = pairs(&[("x-big", &"a".repeat(MAX_HEADER_BLOCK + 1))]);
        let mut compressor = HeaderCompressor::default();
        let block = compressor.compress(&encode_header_block(&huge));
        assert!(block.len() < 2048, "repetitive text compresses well");
        assert_eq!(
            HeaderDecompressor::default().decompress(&block),
            Err(FrameError::HeaderBlockTooLarge)
        );
    }
}
