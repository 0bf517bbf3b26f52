//! Access control by bearer token.
//!
//! Writes and admin routes need a write token. Reads are open, unless read
//! tokens are configured; then a read or a write token is needed. Several
//! tokens can be valid at once, so a token is rotated by adding the new one,
//! moving clients over, and removing the old. Tokens are compared as SHA-256
//! digests in constant time, so neither their content nor their length leaks
//! through timing.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{Method, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::problem::ApiError;
use crate::secret::Secret;

type TokenDigest = [u8; 32];

fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// Who may do what.
#[derive(Clone, Default)]
pub struct Access {
    write: Arc<Vec<TokenDigest>>,
    read: Option<Arc<Vec<TokenDigest>>>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("write_tokens", &self.write.len())
            .field("read_tokens", &self.read.as_ref().map(|r| r.len()))
            .finish()
    }
}

impl Access {
    pub fn new(write: &[Secret], read: Option<&[Secret]>) -> Self {
        Access {
            write: Arc::new(write.iter().map(|t| digest(t.expose())).collect()),
            read: read.map(|r| Arc::new(r.iter().map(|t| digest(t.expose())).collect())),
        }
    }

    fn matches(tokens: &[TokenDigest], presented: &TokenDigest) -> bool {
        // Look at every token, so the time taken says nothing about which matched.
        tokens.iter().fold(subtle::Choice::from(0), |found, t| found | t.ct_eq(presented)).into()
    }

    fn presented(headers: &http::HeaderMap) -> Result<TokenDigest, ApiError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthorized("this needs an Authorization: Bearer <token> header"))?;
        // The scheme is case-insensitive (RFC 9110 section 11.1): `Bearer`, `bearer`, `BEARER`.
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.trim_start().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::unauthorized("the Authorization header must be 'Bearer <token>'"))?;
        Ok(digest(token))
    }

    /// Allows a write, or says why not (401 without a token, 403 with a wrong one).
    pub fn check_write(&self, headers: &http::HeaderMap) -> Result<(), ApiError> {
        if self.write.is_empty() {
            return Err(ApiError::forbidden("writes are disabled: no write token is configured"));
        }
        let presented = Self::presented(headers)?;
        if Self::matches(&self.write, &presented) { Ok(()) } else { Err(ApiError::forbidden("the token does not allow writes")) }
    }

    /// Allows a read: always when reads are open, else with a read or write token.
    pub fn check_read(&self, headers: &http::HeaderMap) -> Result<(), ApiError> {
        let Some(read) = &self.read else { return Ok(()) };
        let presented = Self::presented(headers)?;
        if Self::matches(read, &presented) || Self::matches(&self.write, &presented) {
            Ok(())
        } else {
            Err(ApiError::forbidden("the token does not allow reads"))
        }
    }
}

/// An extractor that admits only requests with a write token. Put it in every
/// write and admin handler's arguments.
#[derive(Debug, Clone, Copy)]
pub struct WriteAccess;

impl<S> FromRequestParts<S> for WriteAccess
where
    Access: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Access::from_ref(state).check_write(&parts.headers)?;
        Ok(WriteAccess)
    }
}

/// Middleware for read routes: applies read tokens when configured. Requests
/// other than GET and HEAD pass through: their handlers ask for [`WriteAccess`].
pub async fn require_read_access(State(access): State<Access>, request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD)
        && let Err(e) = access.check_read(request.headers())
    {
        return e.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn write_tokens_rotate_and_are_checked() {
        let access = Access::new(&[Secret::new("old-token-0123456789"), Secret::new("new-token-0123456789")], None);
        assert!(access.check_write(&headers("Bearer old-token-0123456789")).is_ok());
        assert!(access.check_write(&headers("Bearer new-token-0123456789")).is_ok());
        assert_eq!(access.check_write(&headers("Bearer wrong-token-0123456789")).unwrap_err().status(), 403);
        assert_eq!(access.check_write(&http::HeaderMap::new()).unwrap_err().status(), 401);
        assert_eq!(access.check_write(&headers("Basic dXNlcjpwYXNz")).unwrap_err().status(), 401);
        // The scheme is case-insensitive (RFC 9110 section 11.1); the token is not.
        for scheme in ["BEARER", "bearer", "BeArEr"] {
            assert!(access.check_write(&headers(&format!("{scheme} old-token-0123456789"))).is_ok(), "{scheme}");
        }
        assert_eq!(access.check_write(&headers("Bearer OLD-TOKEN-0123456789")).unwrap_err().status(), 403);
        assert_eq!(access.check_write(&headers("Bearertoken-0123456789")).unwrap_err().status(), 401);
        assert_eq!(access.check_write(&headers("Bearer ")).unwrap_err().status(), 401);
        assert!(access.check_read(&http::HeaderMap::new()).is_ok(), "reads are open by default");
    }

    #[test]
    fn read_tokens_close_reads_and_write_tokens_still_read() {
        let access = Access::new(&[Secret::new("writer-token-0123456789")], Some(&[Secret::new("reader-token-0123456789")]));
        assert_eq!(access.check_read(&http::HeaderMap::new()).unwrap_err().status(), 401);
        assert!(access.check_read(&headers("Bearer reader-token-0123456789")).is_ok());
        assert!(access.check_read(&headers("Bearer writer-token-0123456789")).is_ok());
        assert_eq!(access.check_write(&headers("Bearer reader-token-0123456789")).unwrap_err().status(), 403);
    }

    #[test]
    fn no_write_token_means_no_writes() {
        let access = Access::new(&[], None);
        assert_eq!(access.check_write(&headers("Bearer anything-at-all-123")).unwrap_err().status(), 403);
    }
}
