//! Shared files over HTTP: a request's body streamed into a file of a shared directory (a
//! lease's, the blob store), and a file streamed out as a response.

use std::io;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use sprout_engine::ErrorCode;
use sprout_offload::{file_error, SharedDir};

use crate::http::ApiError;
use crate::stored_files::UploadLimit;

/// Stream a request's `body` into file `name` of `dir`, at most `limit.bytes` (past it: 413
/// naming the limit, and nothing is left); the bytes written.
pub async fn receive(dir: &SharedDir, name: &str, body: Body, limit: &UploadLimit) -> Result<usize, ApiError> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let mut upload = dir.upload(name).map_err(file_error)?;
    let mut file = tokio::fs::File::from_std(upload.file().try_clone().map_err(file_error)?);
    let mut stream = body.into_data_stream();
    let mut size = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("reading the body: {e}")))?;
        size += chunk.len();
        if size > limit.bytes {
            return Err(limit.exceeded());
        }
        file.write_all(&chunk).await.map_err(file_error)?;
    }
    file.flush().await.map_err(file_error)?;
    drop(file);
    tokio::task::spawn_blocking(move || upload.finish())
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e.to_string())))
        .map_err(file_error)?;
    Ok(size)
}

/// File `name` of `dir` as a response, streamed.
pub fn send(dir: &SharedDir, name: &str) -> Result<Response, ApiError> {
    let (file, len) = dir.open(name).map_err(file_error)?;
    let file = tokio::fs::File::from_std(file);
    let chunks = futures_util::stream::unfold(file, |mut file| async move {
        let mut buf = vec![0u8; 256 << 10];
        match tokio::io::AsyncReadExt::read(&mut file, &mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, io::Error>(bytes::Bytes::from(buf)), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    let mut response = Body::from_stream(chunks).into_response();
    let headers = response.headers_mut();
    headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(axum::http::header::CONTENT_LENGTH, HeaderValue::from(len));
    Ok(response)
}
