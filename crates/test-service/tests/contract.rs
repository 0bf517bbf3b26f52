//! The contract check finds a router and an OpenAPI document that disagree.

use axum::routing::get;
use clap::Parser;
use revstore_schema::Component;
use revstore_service::{BoxError, CommonArgs, Context, Platform, Routes, Service, ServiceArgs, ServiceDefinition, SettingsError};
use revstore_test_service::Engine;

static NO_TABLES: Component = Component { name: "drifting", version: 1, compatible_from: 1, tables: &[] };

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
}

impl ServiceArgs for Args {
    type Settings = ();

    fn common(&self) -> &CommonArgs {
        &self.common
    }

    fn settings(&self) -> Result<(), SettingsError> {
        Ok(())
    }
}

#[utoipa::path(get, path = "/{domain}/v1/things/{title}", params(("domain" = String, Path), ("title" = String, Path)),
    responses((status = 200, description = "a thing")))]
async fn thing() -> &'static str {
    "thing"
}

#[utoipa::path(get, path = "/{domain}/v1/gone", params(("domain" = String, Path)), responses((status = 200, description = "documented, not routed")))]
#[allow(dead_code)]
async fn gone() {}

#[derive(utoipa::OpenApi)]
#[openapi(paths(thing, gone))]
struct Doc;

/// Serves `/things/{x}` by GET (documented) and POST (not), `/secret` (not
/// documented at all), and not `/gone` (documented).
struct Drifting;

impl ServiceDefinition for Drifting {
    type Settings = ();
    type Args = Args;
    const NAME: &'static str = "drifting";
    const DEFAULT_PORT: u16 = 0;
    const SCHEMA: &'static Component = &NO_TABLES;

    async fn build((): (), context: Context) -> Result<Service, BoxError> {
        let platform = Platform::new(Self::SCHEMA, context.store, context.settings, <Doc as utoipa::OpenApi>::openapi());
        let routes = Routes::new().route("/{domain}/v1/things/{x}", get(thing).post(thing)).route("/secret", get(thing));
        Ok(Service::new(platform, routes))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_drift_is_reported() {
    let service = revstore_test_service::start_on::<Drifting>(Engine::Embedded, "token-0123456789", &[]).await;
    let mut drift = revstore_test_service::contract_drift(&service, "token-0123456789").await;
    drift.sort();
    assert_eq!(
        drift,
        [
            "documented /{domain}/v1/gone is served by no route",
            "route /secret is not documented",
            "route /{domain}/v1/things/{x} accepts POST, which is not documented",
        ]
    );
}
