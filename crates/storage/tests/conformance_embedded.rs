//! The conformance suite on the embedded (SQLite) engine, with an injected clock.

mod conformance_embedded {
    use std::sync::Arc;

    use revstore_storage::conformance::{Subject, TABLES};
    use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, Store};

    async fn subject() -> Subject {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::starting_now();
        let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
        let engine = EmbeddedEngine::open(dir.path(), options).expect("open");
        let store = Store::new(Arc::new(engine));
        store.ensure_tables(&TABLES).await.expect("tables");
        Subject {
            store,
            advance: Arc::new(move |by| {
                let clock = clock.clone();
                Box::pin(async move { clock.advance(by) })
            }),
            guard: Box::new(dir),
        }
    }

    revstore_storage::conformance_suite!(subject);
}
