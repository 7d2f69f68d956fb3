//! `view_image` (spec/tools.md §8; `codex-rs/core/src/tools/handlers/view_image.rs` and
//! `codex-rs/utils/image`): reads an image file, inside the session's sandbox like every tool,
//! and returns it as a `data:` URL, scaled to fit 2048×2048 unless the model asked for the
//! original resolution.

use crate::tools::{ToolError, resolve_path};
use base64::Engine;
use image::{DynamicImage, GenericImageView, ImageEncoder, ImageError, ImageFormat};
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The longest side of an image sent at default detail (Codex's `MAX_DIMENSION`).
pub const MAX_DIMENSION: u32 = 2048;
/// The largest image file accepted (Codex's `MAX_PROMPT_IMAGE_FILE_BYTES`, 50 MiB).
pub const MAX_IMAGE_FILE_BYTES: u64 = 50 * 1024 * 1024;

/// The call's arguments.
#[derive(Debug, Clone, Deserialize)]
pub struct ViewImageArgs {
    pub path: String,
    #[serde(default)]
    pub detail: Option<String>,
}

/// The image, ready for a `function_call_output` content item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewImageOutput {
    /// The resolved path (reported as given, joined to the cwd when relative).
    pub path: PathBuf,
    /// `data:{mime};base64,{bytes}`.
    pub image_url: String,
    /// `Some("original")` when the original resolution was asked for.
    pub detail: Option<&'static str>,
    pub mime: &'static str,
    pub width: u32,
    pub height: u32,
}

/// Runs the tool on parsed arguments. Errors are Codex's model texts.
pub fn view_image(cwd: &Path, args: &ViewImageArgs) -> Result<ViewImageOutput, ToolError> {
    // `high` is the default (resized); `original` keeps the resolution; anything else is an
    // error rather than reinterpreted (Codex 0.171's values and text).
    let original = match args.detail.as_deref() {
        None | Some("high") => false,
        Some("original") => true,
        Some(other) => {
            return Err(ToolError::invalid(format!(
                "view_image.detail only supports `high` or `original`; omit `detail` for default \
                 high resized behavior, got `{other}`"
            )));
        }
    };
    let path = resolve_path(cwd, &args.path);
    let shown = path.display();
    // Read from the pinned working directory when it lies there (H24); shown as given.
    let at = crate::tools::shell::pinned_cwd::fs_path(&path);
    let metadata = std::fs::metadata(&at)
        .map_err(|e| ToolError::io(&format!("unable to locate image at `{shown}`: "), &e))?;
    if !metadata.is_file() {
        return Err(ToolError::invalid(format!(
            "image path `{shown}` is not a file"
        )));
    }
    let bytes = read_image_file(&at)
        .map_err(|e| ToolError::io(&format!("unable to read image at `{shown}`: "), &e))?
        .ok_or_else(|| ToolError::invalid(format!("image path `{shown}` is not a file")))?;
    let image = prepare(&path, bytes, original)
        .map_err(|e| ToolError::invalid(format!("unable to process image at `{shown}`: {e}")))?;
    Ok(ViewImageOutput {
        image_url: format!(
            "data:{};base64,{}",
            image.mime,
            base64::engine::general_purpose::STANDARD.encode(&image.bytes)
        ),
        path,
        detail: original.then_some("original"),
        mime: image.mime,
        width: image.width,
        height: image.height,
    })
}

/// Reads a regular file, opened without blocking (a FIFO swapped in after the type check
/// cannot hang the call). `None`: not a regular file. More than the limit is read only up to
/// one byte past it; `prepare` refuses it.
fn read_image_file(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Ok(None);
    }
    let capacity = metadata.len().min(MAX_IMAGE_FILE_BYTES + 1);
    let mut bytes = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
    file.take(MAX_IMAGE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// An encoded image.
#[derive(Debug, Clone)]
struct Encoded {
    bytes: Vec<u8>,
    mime: &'static str,
    width: u32,
    height: u32,
}

/// Codex's `load_for_prompt_bytes`: PNG, JPEG and WebP that fit (or `original`) are sent as
/// they are; other decodable images (GIF) become PNG; larger ones are scaled to fit
/// `MAX_DIMENSION` (Triangle filter) and re-encoded in their own format (JPEG at quality 85,
/// WebP lossless), anything else as PNG. The error texts are `ImageProcessingError`'s.
fn prepare(path: &Path, bytes: Vec<u8>, original: bool) -> Result<Encoded, String> {
    let size = bytes.len() as u64;
    if size > MAX_IMAGE_FILE_BYTES {
        return Err(format!(
            "failed to read image at {}: image exceeds the {MAX_IMAGE_FILE_BYTES}-byte limit",
            path.display()
        ));
    }
    let format = match image::guess_format(&bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::Gif | ImageFormat::WebP)) => {
            Some(f)
        }
        _ => None,
    };
    let decoded = image::load_from_memory(&bytes).map_err(|e| decode_error(path, e))?;
    let (width, height) = decoded.dimensions();
    let keep =
        format.filter(|f| matches!(f, ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP));
    if original || (width <= MAX_DIMENSION && height <= MAX_DIMENSION) {
        if let Some(f) = keep {
            return Ok(Encoded {
                bytes,
                mime: mime_of(f),
                width,
                height,
            });
        }
        return encode(&decoded, ImageFormat::Png);
    }
    let resized = decoded.resize(
        MAX_DIMENSION,
        MAX_DIMENSION,
        image::imageops::FilterType::Triangle,
    );
    encode(&resized, keep.unwrap_or(ImageFormat::Png))
}

/// `failed to decode image at {path}: {err}` for a corrupt image; for bytes that are no image
/// corral decodes, `unsupported image `{mime}`` with the MIME type the file name suggests.
fn decode_error(path: &Path, err: ImageError) -> String {
    if matches!(err, ImageError::Decoding(_)) {
        return format!("failed to decode image at {}: {err}", path.display());
    }
    let mime = mime_guess::from_path(path)
        .first()
        .map(|m| m.essence_str().to_owned())
        .unwrap_or_else(|| "unknown".to_string());
    format!("unsupported image `{mime}`")
}

fn mime_of(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Jpeg => "image/jpeg",
        ImageFormat::Gif => "image/gif",
        ImageFormat::WebP => "image/webp",
        _ => "image/png",
    }
}

fn encode(image: &DynamicImage, format: ImageFormat) -> Result<Encoded, String> {
    let mut bytes = Vec::new();
    let (w, h) = image.dimensions();
    let result = match format {
        ImageFormat::Jpeg => {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 85).encode_image(image)
        }
        ImageFormat::WebP => image::codecs::webp::WebPEncoder::new_lossless(&mut bytes)
            .write_image(
                image.to_rgba8().as_raw(),
                w,
                h,
                image::ExtendedColorType::Rgba8,
            ),
        _ => image::codecs::png::PngEncoder::new(&mut bytes).write_image(
            image.to_rgba8().as_raw(),
            w,
            h,
            image::ExtendedColorType::Rgba8,
        ),
    };
    let format = match format {
        ImageFormat::Jpeg | ImageFormat::WebP => format,
        _ => ImageFormat::Png,
    };
    result.map_err(|e| format!("failed to encode image as {format:?}: {e}"))?;
    Ok(Encoded {
        bytes,
        mime: mime_of(format),
        width: w,
        height: h,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Rgba};

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = ImageBuffer::from_pixel(w, h, Rgba([10u8, 20, 30, 255]));
        let mut out = std::io::Cursor::new(Vec::new());
        DynamicImage::ImageRgba8(img)
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        out.into_inner()
    }

    fn args(path: &str, detail: Option<&str>) -> ViewImageArgs {
        ViewImageArgs {
            path: path.into(),
            detail: detail.map(str::to_string),
        }
    }

    #[test]
    fn a_small_png_is_sent_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = png(64, 32);
        std::fs::write(dir.path().join("a.png"), &bytes).unwrap();
        let out = view_image(dir.path(), &args("a.png", None)).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert_eq!(out.image_url, format!("data:image/png;base64,{b64}"));
        assert_eq!((out.width, out.height, out.detail), (64, 32, None));
        assert_eq!(out.path, dir.path().join("a.png"));
    }

    #[test]
    fn a_large_image_is_scaled_unless_original() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.png"), png(1024, 4096)).unwrap();
        let out = view_image(dir.path(), &args("big.png", None)).unwrap();
        assert_eq!((out.width, out.height, out.mime), (512, 2048, "image/png"));
        let out = view_image(dir.path(), &args("big.png", Some("original"))).unwrap();
        assert_eq!(
            (out.width, out.height, out.detail),
            (1024, 4096, Some("original"))
        );
    }

    #[test]
    fn a_gif_becomes_png() {
        let dir = tempfile::tempdir().unwrap();
        let img = DynamicImage::ImageRgba8(ImageBuffer::from_pixel(8, 8, Rgba([1u8, 2, 3, 255])));
        img.save_with_format(dir.path().join("a.gif"), ImageFormat::Gif)
            .unwrap();
        let out = view_image(dir.path(), &args("a.gif", None)).unwrap();
        assert!(out.image_url.starts_with("data:image/png;base64,"));
    }

    #[test]
    fn errors_are_codex_texts() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let err = view_image(dir.path(), &args("nope.png", None)).unwrap_err();
        assert_eq!(
            err.message,
            format!(
                "unable to locate image at `{d}/nope.png`: No such file or directory (os error 2)"
            )
        );
        let err = view_image(dir.path(), &args(".", None)).unwrap_err();
        assert_eq!(err.message, format!("image path `{d}/.` is not a file"));
        std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
        let err = view_image(dir.path(), &args("notes.txt", None)).unwrap_err();
        assert_eq!(
            err.message,
            format!("unable to process image at `{d}/notes.txt`: unsupported image `text/plain`")
        );
        std::fs::write(dir.path().join("blob"), "hello").unwrap();
        let err = view_image(dir.path(), &args("blob", None)).unwrap_err();
        assert_eq!(
            err.message,
            format!("unable to process image at `{d}/blob`: unsupported image `unknown`")
        );
        // A truncated file is an I/O error to the decoder, not a decoding error: Codex's
        // `decode_error` then names the type from the extension.
        let mut truncated = png(4, 4);
        truncated.truncate(30);
        std::fs::write(dir.path().join("cut.png"), truncated).unwrap();
        let err = view_image(dir.path(), &args("cut.png", None)).unwrap_err();
        assert_eq!(
            err.message,
            format!("unable to process image at `{d}/cut.png`: unsupported image `image/png`")
        );
        // A damaged header (its CRC no longer matches) is a decoding error.
        let mut corrupt = png(4, 4);
        corrupt[17] ^= 0xff;
        std::fs::write(dir.path().join("bad.png"), corrupt).unwrap();
        let err = view_image(dir.path(), &args("bad.png", None)).unwrap_err();
        assert!(
            err.message.starts_with(&format!(
                "unable to process image at `{d}/bad.png`: failed to decode image at {d}/bad.png: "
            )),
            "{}",
            err.message
        );
        let err = view_image(dir.path(), &args("a.png", Some("low"))).unwrap_err();
        assert_eq!(
            err.message,
            "view_image.detail only supports `high` or `original`; omit `detail` for default \
             high resized behavior, got `low`"
        );
        // `high` is the default, resized.
        std::fs::write(dir.path().join("a.png"), png(4, 4)).unwrap();
        let high = view_image(dir.path(), &args("a.png", Some("high"))).unwrap();
        let default = view_image(dir.path(), &args("a.png", None)).unwrap();
        assert_eq!(high.detail, default.detail);
    }

    #[test]
    fn the_size_limit_is_codex_text() {
        let err = prepare(
            Path::new("/x/huge.png"),
            vec![0; (MAX_IMAGE_FILE_BYTES + 1) as usize],
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "failed to read image at /x/huge.png: image exceeds the 52428800-byte limit"
        );
    }
}
