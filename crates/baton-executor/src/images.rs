//! Images by URL for providers that take only inline bytes (Bedrock's Converse): the engine
//! fetches each through the outbound guard (the URL is the client's: a private address is
//! refused as for any tenant-supplied destination) and sends it as base64, so an `image_url`
//! part works with every provider (SPEC.md "Message object").

use std::time::Duration;

use base64::Engine as _;
use baton_domain::chat::{ContentPart, ImageSource, InferenceRequest};
use baton_providers::Registry;
use baton_providers::routing::Chain;
use baton_tools::{GuardedClient, ToolError};

use crate::error::{ExecutorError, ExecutorResult};

/// The largest image fetched: Converse's own limit per image (3.75 MB).
pub const MAX_IMAGE_BYTES: usize = 3_750_000;
/// How long one image may take to fetch.
pub const IMAGE_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether some model of `chain` is served by a provider that needs `request`'s image URLs
/// fetched. Cheap when the request has no image URL, the usual case.
pub fn needs_inlining(request: &InferenceRequest, chain: &Chain, providers: &Registry) -> bool {
    let has_url = request.messages.iter().any(|message| {
        message.content.iter().any(|part| {
            matches!(
                part,
                ContentPart::Image {
                    source: ImageSource::Url { .. },
                    ..
                }
            )
        })
    });
    has_url
        && chain.models.iter().any(|model| {
            providers
                .get(&model.provider)
                .is_ok_and(|provider| !provider.takes_image_urls())
        })
}

/// Replaces every image URL of `request` with the image's bytes, fetched concurrently. A URL
/// that cannot be fetched, or that is not a PNG, JPEG, GIF or WebP image, is the client's
/// error, naming the part.
pub async fn inline_image_urls(
    client: &GuardedClient,
    request: &mut InferenceRequest,
) -> ExecutorResult<()> {
    let mut fetches = Vec::new();
    for (m, message) in request.messages.iter().enumerate() {
        for (p, part) in message.content.iter().enumerate() {
            if let ContentPart::Image {
                source: ImageSource::Url { url },
                ..
            } = part
            {
                fetches.push(fetch_image(client, url.clone(), m, p));
            }
        }
    }
    for (m, p, inline) in futures::future::try_join_all(fetches).await? {
        if let Some(ContentPart::Image { source, .. }) = request
            .messages
            .get_mut(m)
            .and_then(|message| message.content.get_mut(p))
        {
            *source = inline;
        }
    }
    Ok(())
}

async fn fetch_image(
    client: &GuardedClient,
    url: String,
    message: usize,
    part: usize,
) -> ExecutorResult<(usize, usize, ImageSource)> {
    let param = format!("messages[{message}].content[{part}].image_url.url");
    let refuse = |why: String| ExecutorError::Validation {
        param: param.clone(),
        message: format!(
            "the image at this URL is needed inline by the model's provider and {why}"
        ),
    };
    let parsed = url::Url::parse(&url).map_err(|e| refuse(format!("the URL is invalid: {e}")))?;
    let fetched = client
        .fetch(&parsed, MAX_IMAGE_BYTES, IMAGE_FETCH_TIMEOUT)
        .await
        .map_err(|error| {
            refuse(match error {
                ToolError::TooLarge { limit } => format!("is larger than {limit} bytes"),
                ToolError::Timeout => format!(
                    "could not be fetched within {} s",
                    IMAGE_FETCH_TIMEOUT.as_secs()
                ),
                other => format!("could not be fetched: {other}"),
            })
        })?;
    let media_type = image_type(&fetched.body).ok_or_else(|| {
        refuse(format!(
            "is not a PNG, JPEG, GIF or WebP image (content-type {})",
            fetched.content_type.as_deref().unwrap_or("not given")
        ))
    })?;
    let inline = ImageSource::Base64 {
        media_type: media_type.to_string(),
        data: base64::engine::general_purpose::STANDARD.encode(&fetched.body),
    };
    Ok((message, part, inline))
}

/// The image type by its leading bytes (a server's `content-type` is often generic or wrong).
fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_told_apart_by_their_leading_bytes() {
        assert_eq!(image_type(b"\x89PNG\r\n\x1a\n...."), Some("image/png"));
        assert_eq!(image_type(b"\xff\xd8\xff\xe0..JFIF"), Some("image/jpeg"));
        assert_eq!(image_type(b"GIF89a.."), Some("image/gif"));
        assert_eq!(image_type(b"RIFF\x10\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(
            image_type(b"RIFF\x10\0\0\0WAVEfmt "),
            None,
            "a RIFF that is not WebP"
        );
        assert_eq!(image_type(b"<html>not an image</html>"), None);
        assert_eq!(image_type(b""), None);
    }
}
