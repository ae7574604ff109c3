//! Types that exist only to describe values in the OpenAPI document.

use utoipa::ToSchema;

/// A subject id or series name: 1 to 256 bytes of UTF-8, with no control characters and no
/// `.` or `..` segment between slashes. (JSON Schema counts characters, not bytes, so a name
/// of many multi-byte characters can pass this schema and still be refused.)
#[derive(ToSchema)]
#[schema(
    min_length = 1,
    max_length = 256,
    pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
)]
#[expect(dead_code, reason = "describes names in the OpenAPI document only")]
pub struct Name(String);
