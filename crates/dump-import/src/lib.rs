//! Imports a MediaWiki XML history dump (`pages-meta-history`) into old-store
//! and the dependency graph, through their HTTP APIs, the way a wiki's
//! history would be loaded.
//!
//! The dump is read as a stream: a `.7z` archive is decompressed entry by entry
//! as it is parsed, `.bz2` and `.gz` files as they are read, a `.xml` file is
//! read directly; memory stays bounded whatever the dump's size (one
//! revision's text at a time per writer, the page's latest text, and bounded
//! queues between the parser and the writers).
//!
//! # Layout
//! - [`cli`]: `revstore import`'s command line, token and progress bar.
//! - [`dump`]: the streaming parser (siteinfo, pages, revisions).
//! - [`import`]: the writers: revisions of one page go to one writer, in dump
//!   order (old-store compresses each against the one before it); pages are
//!   spread over several writers. After a page's last revision, its
//!   dependency set (what its latest revision transcludes) goes to the graph.
//! - [`templates`]: the transclusions of a wikitext, and what is approximated.

pub mod cli;
pub mod dump;
pub mod import;
pub mod templates;

pub use dump::{DumpError, Revision, read_dump};
pub use import::{Dependencies, ImportOptions, ImportSummary, Mode, run_import};
