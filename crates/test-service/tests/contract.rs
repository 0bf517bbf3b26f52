//! The contract check finds a router and an OpenAPI document that disagree.

use axum::routing::get;
use revstore_schema::Component;
use revstore_service::{BoxError, Context, NoSettings, Platform, Routes, Service, ServiceDefinition};
use revstore_test_service::Engine;

static NO_TABLES: Component = Component { name: "drifting", version: 1, compatible_from: 1, tables: &[] };

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
    type Settings = NoSettings;
    const NAME: &'static str = "drifting";
    const BINARY: &'static str = "revstore-drifting";
    const ABOUT: &'static str = "a service whose routes and document disagree";
    const DEFAULT_PORT: u16 = 0;
    const SCHEMA: &'static Component = &NO_TABLES;

    async fn build(_: NoSettings, context: Context) -> Result<Service, BoxError> {
        let platform = Platform::new(Self::SCHEMA, context.store, context.settings, <Doc as utoipa::OpenApi>::openapi());
        let routes = Routes::new().route("/{domain}/v1/things/{x}", get(thing).post(thing)).route("/secret", get(thing));
        Ok(Service::new(platform, routes))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_drift_is_reported() {
    let service =
        revstore_test_service::start_on(Engine::Embedded, revstore_test_service::TestSettings::<Drifting>::new("token-0123456789")).await;
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
