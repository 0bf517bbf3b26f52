//! Bearer tokens: the one way every part of revstore reads them.
//!
//! A token file holds one token per line; blank lines and lines starting with
//! `#` are skipped, and the space around a token is trimmed. Every token in it
//! is accepted by a service that reads it as its write (or read) tokens; a
//! caller that reads it as its peer token sends the **first** one. So one file
//! can be mounted as both, and a token is rotated in three rolling restarts:
//! add the new token on a line below the old (every service accepts both,
//! every caller still sends the old), move it to the first line (callers send
//! the new), remove the old.
//!
//! A token is at least [`MIN_TOKEN_LEN`] characters of printable ASCII without
//! spaces, so it always fits in an `Authorization` header and is never a typo'd
//! fragment of one.

use std::path::Path;

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest token accepted: far above any generated token, far below a
/// header limit.
pub const MAX_TOKEN_LEN: usize = 1024;
/// The largest token file read: a file bigger than this is not a token file.
pub const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

/// A token or token file that cannot be used, said without the token itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(String);

/// Checks one token: its length and that every character can go in a header.
pub fn check_token(token: &str, what: &str) -> Result<(), TokenError> {
    if token.len() < MIN_TOKEN_LEN {
        return Err(TokenError(format!("a {what} is {} characters long; use at least {MIN_TOKEN_LEN}", token.len())));
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError(format!("a {what} is {} characters long; use at most {MAX_TOKEN_LEN}", token.len())));
    }
    if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(TokenError(format!(
            "a {what} holds {}; tokens are printable ASCII without spaces",
            if bad.is_whitespace() { "a space".to_owned() } else { format!("the character U+{:04X}", bad as u32) }
        )));
    }
    Ok(())
}

/// The tokens of a token file's text, in order, each checked.
pub fn parse_token_file(text: &str, what: &str) -> Result<Vec<String>, TokenError> {
    let mut tokens = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        check_token(line, what).map_err(|e| TokenError(format!("line {}: {e}", number + 1)))?;
        tokens.push(line.to_owned());
    }
    Ok(tokens)
}

/// Every token of a token file (for a service's accepted tokens).
pub fn read_token_file(path: &Path, what: &str) -> Result<Vec<String>, TokenError> {
    let unreadable = |e: std::io::Error| TokenError(format!("cannot read the {what} file {}: {e}", path.display()));
    let size = std::fs::metadata(path).map_err(unreadable)?.len();
    if size > MAX_TOKEN_FILE_BYTES {
        return Err(TokenError(format!(
            "the {what} file {} is {size} bytes; a token file is at most {MAX_TOKEN_FILE_BYTES}",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    parse_token_file(&text, what).map_err(|e| TokenError(format!("the {what} file {}: {e}", path.display())))
}

/// The token a caller sends: the first of the file. A file with no token is an error.
pub fn read_peer_token(path: &Path, what: &str) -> Result<String, TokenError> {
    read_token_file(path, what)?.into_iter().next().ok_or_else(|| TokenError(format!("the {what} file {} holds no token", path.display())))
}

/// The tokens of a comma-separated list (`REVSTORE_WRITE_TOKENS`), each
/// trimmed and checked; empty items are skipped.
pub fn parse_token_list(list: &str, what: &str) -> Result<Vec<String>, TokenError> {
    list.split(',').map(str::trim).filter(|t| !t.is_empty()).map(|t| check_token(t, what).map(|()| t.to_owned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old-token-0123456789";
    const NEW: &str = "new-token-0123456789";

    #[test]
    fn a_rotation_file_gives_every_token_and_the_first_to_send() {
        let text = format!("# rotation: new below old\n{OLD}\n\n  {NEW}  \r\n");
        assert_eq!(parse_token_file(&text, "write token").unwrap(), [OLD, NEW]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, text).unwrap();
        assert_eq!(read_peer_token(&path, "peer token").unwrap(), OLD);
        assert_eq!(read_token_file(&path, "write token").unwrap(), [OLD, NEW]);
    }

    #[test]
    fn bad_tokens_are_refused_by_line_without_repeating_them() {
        let short = parse_token_file(&format!("{OLD}\nshort\n"), "write token").unwrap_err().to_string();
        assert!(short.contains("line 2") && short.contains("at least 16") && !short.contains("short\n"), "{short}");
        let spaced = parse_token_file("a token with spaces in it", "write token").unwrap_err().to_string();
        assert!(spaced.contains("a space") && !spaced.contains("with spaces"), "{spaced}");
        let control = parse_token_file("token-0123456789\u{7}", "write token").unwrap_err().to_string();
        assert!(control.contains("U+0007"), "{control}");
        assert!(parse_token_file(&"x".repeat(MAX_TOKEN_LEN + 1), "write token").is_err());
    }

    #[test]
    fn an_empty_or_oversized_file_is_refused_as_a_peer_token() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "# nothing yet\n\n").unwrap();
        assert!(read_peer_token(&empty, "peer token").unwrap_err().to_string().contains("holds no token"));
        assert!(read_token_file(&empty, "write token").unwrap().is_empty());
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; MAX_TOKEN_FILE_BYTES as usize + 1]).unwrap();
        assert!(read_peer_token(&big, "peer token").unwrap_err().to_string().contains("at most"));
        assert!(read_peer_token(&dir.path().join("missing"), "peer token").unwrap_err().to_string().contains("cannot read"));
    }

    #[test]
    fn a_token_list_skips_empty_items_and_checks_the_rest() {
        assert_eq!(parse_token_list(&format!(" {OLD}, ,{NEW},"), "write token").unwrap(), [OLD, NEW]);
        assert!(parse_token_list("tooshort", "write token").is_err());
    }
}
