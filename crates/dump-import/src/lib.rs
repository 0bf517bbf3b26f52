//! Imports a MediaWiki XML history dump (`pages-meta-history`) into old-store,
//! through its HTTP API, the way a wiki's history would be loaded.
//!
//! The dump is read as a stream: a `.7z` archive is decompressed entry by entry
//! as it is parsed, a `.xml` file is read directly; memory stays bounded
//! whatever the dump's size (one revision's text at a time per writer, and
//! bounded queues between the parser and the writers).
//!
//! # Layout
//! - [`dump`]: the streaming parser (siteinfo, pages, revisions).
//! - [`import`]: the writers: revisions of one page go to one writer, in dump
//!   order (old-store compresses each against the one before it); pages are
//!   spread over several writers.

pub mod dump;
pub mod import;

pub use dump::{DumpError, Revision, read_dump};
pub use import::{ImportOptions, ImportSummary, Mode, run_import};
