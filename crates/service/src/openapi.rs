//! What every service's OpenAPI document says the same way, added in one
//! place to each document a service serves (`/openapi.json`):
//! - the `bearer` security scheme the operations name;
//! - the problem+json answers the platform can give on any route: 400 (a key
//!   or query that does not parse), 401 and 403 (writes, admin routes, and
//!   reads when read tokens are set), 415 (a `Content-Encoding`), 500, 503
//!   (the in-flight limit, storage or a peer unavailable, the request timeout); 413 and 422 where
//!   the operation takes a body;
//! - the constraints of the path parameters every contract path shares:
//!   `domain`, `title`, `rev`, `tid`.
//!
//! A service documents what is its own (200s, 404s, 409, 412) with its routes.

use utoipa::openapi::path::{Operation, Parameter};
use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, KnownFormat, OpenApi, Ref, RefOr, ResponseBuilder};

use crate::problem::PROBLEM_JSON;

/// Answers any route can give, with what they mean.
const EVERY_ROUTE: [(&str, &str); 6] = [
    ("400", "the request is malformed: a key, query parameter or body that does not parse"),
    ("401", "a token is needed (writes and admin routes; reads too when read tokens are set)"),
    ("403", "the token does not allow this"),
    ("415", "the body has a Content-Encoding (bodies are not decoded) or another media type"),
    ("500", "internal error; the request id leads to the details in the logs"),
    (
        "503",
        "the service is at its limit of requests in flight (`overloaded`, with Retry-After), the storage or a peer service is unavailable, or the request timed out; retry later",
    ),
];

/// Answers of operations that take a body.
const WITH_A_BODY: [(&str, &str); 2] = [
    ("413", "the body is larger than this service accepts (REVSTORE_BODY_LIMIT_BYTES)"),
    ("422", "the body is JSON, but not of the expected shape"),
];

/// Completes a service's document (see the module documentation).
pub fn complete(mut doc: OpenApi) -> OpenApi {
    doc.components.get_or_insert_with(Default::default).add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("a write token (REVSTORE_WRITE_TOKENS), or a read token for reads when read tokens are set"))
                .build(),
        ),
    );
    for item in doc.paths.paths.values_mut() {
        for operation in
            [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch, &mut item.head].into_iter().flatten()
        {
            complete_operation(operation);
        }
    }
    doc
}

fn problem_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(PROBLEM_JSON, ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build())
            .build(),
    )
}

fn complete_operation(operation: &mut Operation) {
    let has_body = operation.request_body.is_some();
    let responses = &mut operation.responses.responses;
    // Error answers the service documented itself are problem documents too.
    for (status, response) in responses.iter_mut() {
        if (status.starts_with('4') || status.starts_with('5'))
            && let RefOr::T(response) = response
            && let Some(content) = response.content.shift_remove("application/json")
        {
            response.content.insert(PROBLEM_JSON.to_owned(), content);
        }
    }
    let platform = EVERY_ROUTE.iter().chain(if has_body { &WITH_A_BODY[..] } else { &[] });
    for (status, description) in platform {
        responses.entry((*status).to_owned()).or_insert_with(|| problem_response(description));
    }
    for parameter in operation.parameters.iter_mut().flatten() {
        if let RefOr::T(parameter) = parameter {
            constrain(parameter);
        }
    }
}

/// The constraints of the path parameters every service shares.
fn constrain(parameter: &mut Parameter) {
    let schema = match parameter.name.as_str() {
        "domain" => ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(253))
            .pattern(Some("^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"))
            .description(Some("the wiki's host name"))
            .build(),
        "title" => ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(255))
            .description(Some("the page title, percent-encoded (a '/' is %2F); at most 255 bytes of UTF-8, MediaWiki's rules"))
            .build(),
        "rev" => ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .build(),
        "tid" => ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("uuid".to_owned())))
            .pattern(Some("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-1[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$"))
            .description(Some("a time-based (version 1) UUID, between 2001 and five minutes from now"))
            .build(),
        _ => return,
    };
    parameter.schema = Some(RefOr::T(schema.into()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::OpenApi as _;

    #[derive(utoipa::OpenApi)]
    #[openapi(paths(put_item), components(schemas(crate::problem::Problem)))]
    struct Doc;

    #[utoipa::path(put, path = "/{domain}/v1/items/{title}/{rev}", request_body = String,
        params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path)),
        responses((status = 201), (status = 409, body = crate::problem::Problem)), security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn put_item() {}

    #[test]
    fn the_platform_answers_schemes_and_constraints_are_added() {
        let doc = serde_json::to_value(complete(Doc::openapi())).unwrap();
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        let op = &doc["paths"]["/{domain}/v1/items/{title}/{rev}"]["put"];
        for status in ["201", "400", "401", "403", "409", "413", "415", "422", "500", "503"] {
            assert!(op["responses"][status].is_object(), "{status} missing: {op}");
        }
        assert!(op["responses"]["409"]["content"]["application/problem+json"].is_object(), "{op}");
        assert!(op["responses"]["409"]["content"]["application/json"].is_null(), "{op}");
        let params = op["parameters"].as_array().unwrap();
        let schema = |name: &str| params.iter().find(|p| p["name"] == name).unwrap()["schema"].clone();
        assert_eq!(schema("rev")["minimum"], 1);
        assert_eq!(schema("title")["maxLength"], 255);
        assert!(schema("domain")["pattern"].is_string());
    }
}
