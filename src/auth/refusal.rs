//! Plain words for `jsonwebtoken`'s refusals: its errors display as Rust
//! variant names (`InvalidToken`), which a client cannot act on.

use jsonwebtoken::errors::{Error, ErrorKind};

use super::AuthError;

/// The text of every refusal of a token that is not a JWT at all.
pub const NOT_A_JWT: &str =
    "the bearer token is not a valid JWT (expected three base64url parts: header.claims.signature)";

/// Why a token's header could not be read ([`jsonwebtoken::decode_header`]).
pub(super) fn malformed(e: &Error) -> AuthError {
    AuthError::token_invalid(match e.kind() {
        ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
            "the bearer token is not a valid JWT: its header is not a JSON object naming a supported \"alg\""
        }
        _ => NOT_A_JWT,
    })
}

/// Why a token with a readable header was refused ([`jsonwebtoken::decode`]).
pub(super) fn refused(e: &Error) -> AuthError {
    let message = match e.kind() {
        ErrorKind::ExpiredSignature => return AuthError::TokenExpired,
        ErrorKind::ImmatureSignature => "the token is not valid yet".to_owned(),
        ErrorKind::InvalidIssuer => "the token's issuer is not trusted".to_owned(),
        ErrorKind::InvalidAudience => "the token is not meant for this service".to_owned(),
        ErrorKind::InvalidSubject => "the token's subject is not accepted".to_owned(),
        ErrorKind::MissingRequiredClaim(c) => format!("the token lacks the claim {c:?}"),
        ErrorKind::InvalidClaimFormat(c) => format!("the token's claim {c:?} has the wrong type"),
        ErrorKind::InvalidToken | ErrorKind::Base64(_) => NOT_A_JWT.to_owned(),
        ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
            "the token's claims are not a JSON object with the expected types \
             (strings for sub, iss and scope, numbers for exp, iat and nbf)"
                .to_owned()
        }
        ErrorKind::InvalidAlgorithm
        | ErrorKind::MissingAlgorithm
        | ErrorKind::UnsupportedAlgorithm
        | ErrorKind::InvalidAlgorithmName => {
            "the token's algorithm is not the one of its key".to_owned()
        }
        // A signature of the wrong size or encoding fails like a wrong one.
        _ => "the token's signature does not verify".to_owned(),
    };
    AuthError::token_invalid(message)
}
