//! Images as they are stored (T22): decoded and encoded again in their own format, which
//! leaves every metadata block behind (EXIF with its GPS position, XMP, text chunks,
//! colour profiles), turned upright by their EXIF orientation first, and scaled down to
//! the configured longest side. An animated GIF keeps its first frame.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use super::sniff::Sniffed;

/// The JPEG quality of a re-encoded photo: no visible loss, about half the size of 100.
const JPEG_QUALITY: u8 = 90;
/// The most memory one decode may take: a 64-megapixel RGBA image.
const MAX_DECODE_BYTES: u64 = 256 << 20;
/// The widest or tallest image decoded at all.
const MAX_DECODE_SIDE: u32 = 16_384;

/// The bytes of `kind` (an image) cleaned and bounded to `max_side`; `None` when they do
/// not decode as the image their magic number says.
pub fn clean(bytes: &[u8], kind: Sniffed, max_side: u32) -> Option<Vec<u8>> {
    let format = match kind {
        Sniffed::Png => ImageFormat::Png,
        Sniffed::Jpeg => ImageFormat::Jpeg,
        Sniffed::Gif => ImageFormat::Gif,
        Sniffed::Webp => ImageFormat::WebP,
        _ => return None,
    };
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    limits.max_image_width = Some(MAX_DECODE_SIDE);
    limits.max_image_height = Some(MAX_DECODE_SIDE);
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits);
    let mut decoder = reader.into_decoder().ok()?;
    let orientation = decoder.orientation().ok();
    let mut picture = DynamicImage::from_decoder(decoder).ok()?;
    if let Some(orientation) = orientation {
        picture.apply_orientation(orientation);
    }
    if picture.width().max(picture.height()) > max_side {
        picture = picture.resize(max_side, max_side, FilterType::Triangle);
    }
    let mut out = Vec::new();
    let encoded = match format {
        ImageFormat::Jpeg => JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY)
            .encode_image(&picture)
            .is_ok(),
        other => picture.write_to(&mut Cursor::new(&mut out), other).is_ok(),
    };
    encoded.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let picture = DynamicImage::new_rgb8(width, height);
        let mut out = Vec::new();
        picture
            .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn a_large_image_is_scaled_to_the_longest_side() {
        let cleaned = clean(&png(300, 150), Sniffed::Png, 100).unwrap();
        let back = image::load_from_memory(&cleaned).unwrap();
        assert_eq!((back.width(), back.height()), (100, 50));
        let kept = clean(&png(60, 40), Sniffed::Png, 100).unwrap();
        let back = image::load_from_memory(&kept).unwrap();
        assert_eq!((back.width(), back.height()), (60, 40));
    }

    /// Every format comes back in its own format, decodable, bounded.
    #[test]
    fn each_format_is_encoded_again_in_its_own() {
        let picture = DynamicImage::new_rgba8(120, 60);
        for (format, kind) in [
            (ImageFormat::Png, Sniffed::Png),
            (ImageFormat::Jpeg, Sniffed::Jpeg),
            (ImageFormat::Gif, Sniffed::Gif),
            (ImageFormat::WebP, Sniffed::Webp),
        ] {
            let source = if format == ImageFormat::Jpeg {
                DynamicImage::ImageRgb8(picture.to_rgb8())
            } else {
                picture.clone()
            };
            let mut bytes = Vec::new();
            source
                .write_to(&mut Cursor::new(&mut bytes), format)
                .unwrap();
            let cleaned = clean(&bytes, kind, 60).unwrap();
            assert_eq!(crate::files::sniff(&cleaned, "x"), kind, "{format:?}");
            let back = image::load_from_memory_with_format(&cleaned, format).unwrap();
            assert_eq!((back.width(), back.height()), (60, 30), "{format:?}");
        }
    }

    #[test]
    fn bytes_that_do_not_decode_are_refused() {
        assert!(clean(b"\x89PNG\r\n\x1a\nbroken", Sniffed::Png, 100).is_none());
        assert!(clean(&png(4, 4), Sniffed::Pdf, 100).is_none());
    }
}
