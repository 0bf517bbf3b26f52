//! Cell values and rows.

use std::cmp::Ordering;

use revstore_keys::Tid;
use revstore_schema::ColumnType;
use uuid::Uuid;

use crate::error::StoreError;

/// One cell's value. `Null` in a write deletes the cell (a cell tombstone).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    Null,
    Text(String),
    BigInt(i64),
    Blob(Vec<u8>),
    /// A version 1 UUID (validated when written to a `timeuuid` column).
    TimeUuid(Uuid),
    /// Milliseconds since the Unix epoch.
    Timestamp(i64),
    Boolean(bool),
}

impl Value {
    pub fn column_type(&self) -> Option<ColumnType> {
        Some(match self {
            Value::Null => return None,
            Value::Text(_) => ColumnType::Text,
            Value::BigInt(_) => ColumnType::BigInt,
            Value::Blob(_) => ColumnType::Blob,
            Value::TimeUuid(_) => ColumnType::TimeUuid,
            Value::Timestamp(_) => ColumnType::Timestamp,
            Value::Boolean(_) => ColumnType::Boolean,
        })
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// Bytes of the value as CQL serializes it (0 for null): the unit in which
    /// storage audits count what a table holds, the same on both engines.
    pub fn stored_len(&self) -> u64 {
        match self {
            Value::Null => 0,
            Value::Text(s) => s.len() as u64,
            Value::BigInt(_) | Value::Timestamp(_) => 8,
            Value::Blob(b) => b.len() as u64,
            Value::TimeUuid(_) => 16,
            Value::Boolean(_) => 1,
        }
    }

    /// The value as CQL serializes it: what Cassandra hashes for tokens and
    /// compares when two writes carry the same timestamp.
    pub fn cql_bytes(&self) -> Vec<u8> {
        match self {
            Value::Null => Vec::new(),
            Value::Text(s) => s.as_bytes().to_vec(),
            Value::BigInt(v) | Value::Timestamp(v) => v.to_be_bytes().to_vec(),
            Value::Blob(b) => b.clone(),
            Value::TimeUuid(u) => u.as_bytes().to_vec(),
            Value::Boolean(b) => vec![*b as u8],
        }
    }

    /// Orders two values of one column type as Cassandra orders that type.
    /// Values of different types (never compared by a valid request) order by type.
    pub fn cmp_same_type(&self, other: &Value) -> Ordering {
        match (self, other) {
            (Value::Text(a), Value::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Value::BigInt(a), Value::BigInt(b)) | (Value::Timestamp(a), Value::Timestamp(b)) => a.cmp(b),
            (Value::Blob(a), Value::Blob(b)) => a.cmp(b),
            (Value::TimeUuid(a), Value::TimeUuid(b)) => match (Tid::from_uuid(*a), Tid::from_uuid(*b)) {
                (Ok(a), Ok(b)) => a.cmp(&b),
                _ => a.cmp(b),
            },
            (Value::Boolean(a), Value::Boolean(b)) => a.cmp(b),
            _ => self.type_rank().cmp(&other.type_rank()),
        }
    }

    fn type_rank(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Text(_) => 1,
            Value::BigInt(_) => 2,
            Value::Blob(_) => 3,
            Value::TimeUuid(_) => 4,
            Value::Timestamp(_) => 5,
            Value::Boolean(_) => 6,
        }
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::BigInt(v)
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Blob(v)
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Blob(v.to_vec())
    }
}
impl From<Tid> for Value {
    fn from(v: Tid) -> Self {
        Value::TimeUuid(v.uuid())
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Boolean(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// Compares two clustering prefixes column by column, in value order.
pub fn cmp_keys(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        match x.cmp_same_type(y) {
            Ordering::Equal => continue,
            other => return other,
        }
    }
    a.len().cmp(&b.len())
}

/// A row as read: its columns by name, key columns included. A cell that is not
/// set, deleted or expired reads as `Value::Null`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Row {
    cells: Vec<(&'static str, Value)>,
}

impl Row {
    pub fn new(cells: Vec<(&'static str, Value)>) -> Self {
        Row { cells }
    }

    pub fn get(&self, column: &str) -> Option<&Value> {
        self.cells.iter().find(|(name, _)| *name == column).map(|(_, v)| v).filter(|v| !v.is_null())
    }

    pub fn columns(&self) -> impl Iterator<Item = (&'static str, &Value)> {
        self.cells.iter().map(|(n, v)| (*n, v))
    }

    pub fn text(&self, column: &str) -> Option<&str> {
        match self.get(column) {
            Some(Value::Text(s)) => Some(s),
            _ => None,
        }
    }

    pub fn bigint(&self, column: &str) -> Option<i64> {
        match self.get(column) {
            Some(Value::BigInt(v)) => Some(*v),
            _ => None,
        }
    }

    pub fn blob(&self, column: &str) -> Option<&[u8]> {
        match self.get(column) {
            Some(Value::Blob(b)) => Some(b),
            _ => None,
        }
    }

    pub fn timeuuid(&self, column: &str) -> Option<Uuid> {
        match self.get(column) {
            Some(Value::TimeUuid(u)) => Some(*u),
            _ => None,
        }
    }

    pub fn timestamp(&self, column: &str) -> Option<i64> {
        match self.get(column) {
            Some(Value::Timestamp(v)) => Some(*v),
            _ => None,
        }
    }

    pub fn boolean(&self, column: &str) -> Option<bool> {
        match self.get(column) {
            Some(Value::Boolean(v)) => Some(*v),
            _ => None,
        }
    }

    /// Moves the cells of the columns `moved` names out of the row, into a
    /// row of their own (no value is copied).
    pub fn split_off(&mut self, moved: impl Fn(&str) -> bool) -> Row {
        let (taken, kept) = std::mem::take(&mut self.cells).into_iter().partition(|(name, _)| moved(name));
        self.cells = kept;
        Row { cells: taken }
    }

    /// Moves a column's value out of the row.
    pub fn take(&mut self, column: &str) -> Value {
        self.cells.iter_mut().find(|(name, _)| *name == column).map(|(_, v)| std::mem::replace(v, Value::Null)).unwrap_or(Value::Null)
    }
}

/// A compact, self-describing encoding of a list of values, used inside page
/// tokens and for keys the embedded engine keeps as bytes.
pub fn encode_values(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(values.len() as u16).to_be_bytes());
    for v in values {
        match v {
            Value::Null => out.push(0),
            Value::Text(s) => {
                out.push(1);
                out.extend_from_slice(&(s.len() as u32).to_be_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            Value::BigInt(i) => {
                out.push(2);
                out.extend_from_slice(&i.to_be_bytes());
            }
            Value::Blob(b) => {
                out.push(3);
                out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                out.extend_from_slice(b);
            }
            Value::TimeUuid(u) => {
                out.push(4);
                out.extend_from_slice(u.as_bytes());
            }
            Value::Timestamp(i) => {
                out.push(5);
                out.extend_from_slice(&i.to_be_bytes());
            }
            Value::Boolean(b) => out.extend_from_slice(&[6, *b as u8]),
        }
    }
    out
}

/// Decodes [`encode_values`]; any other input is an error, never a panic.
pub fn decode_values(mut input: &[u8]) -> Result<Vec<Value>, StoreError> {
    fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], StoreError> {
        if input.len() < n {
            return Err(StoreError::Corrupt("truncated value list".into()));
        }
        let (head, rest) = input.split_at(n);
        *input = rest;
        Ok(head)
    }
    fn array<const N: usize>(input: &mut &[u8]) -> Result<[u8; N], StoreError> {
        let mut a = [0u8; N];
        a.copy_from_slice(take(input, N)?);
        Ok(a)
    }
    let count = u16::from_be_bytes(array(&mut input)?) as usize;
    let mut values = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let tag = take(&mut input, 1)?[0];
        values.push(match tag {
            0 => Value::Null,
            1 | 3 => {
                let len = u32::from_be_bytes(array(&mut input)?) as usize;
                let bytes = take(&mut input, len)?.to_vec();
                if tag == 3 {
                    Value::Blob(bytes)
                } else {
                    Value::Text(String::from_utf8(bytes).map_err(|_| StoreError::Corrupt("text value is not UTF-8".into()))?)
                }
            }
            2 => Value::BigInt(i64::from_be_bytes(array(&mut input)?)),
            4 => Value::TimeUuid(Uuid::from_bytes(array(&mut input)?)),
            5 => Value::Timestamp(i64::from_be_bytes(array(&mut input)?)),
            6 => match take(&mut input, 1)?[0] {
                0 => Value::Boolean(false),
                1 => Value::Boolean(true),
                _ => return Err(StoreError::Corrupt("boolean value is neither 0 nor 1".into())),
            },
            other => return Err(StoreError::Corrupt(format!("unknown value tag {other}"))),
        });
    }
    if !input.is_empty() {
        return Err(StoreError::Corrupt("trailing bytes after value list".into()));
    }
    Ok(values)
}

/// Bytes as lower-case hex: how positions travel as text (page cursors,
/// consistency positions).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of hex text; `None` for anything that is not pairs of hex digits.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

/// The clustering key of a row read from `table`.
pub fn clustering_key(table: &revstore_schema::TableDef, row: &Row) -> Vec<Value> {
    table.clustering().map(|(c, _)| row.get(c.name).cloned().unwrap_or(Value::Null)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_lists_round_trip_and_reject_garbage() {
        let values = vec![
            Value::Null,
            Value::Text("Ünïcode".into()),
            Value::BigInt(-5),
            Value::Blob(vec![0, 255]),
            Value::TimeUuid(Tid::now().uuid()),
            Value::Timestamp(1_700_000_000_000),
            Value::Boolean(true),
        ];
        assert_eq!(decode_values(&encode_values(&values)).unwrap(), values);
        let encoded = encode_values(&values);
        for cut in 0..encoded.len() {
            assert!(decode_values(&encoded[..cut]).is_err());
        }
        assert!(decode_values(&[0, 1, 9]).is_err());
    }

    #[test]
    fn timeuuids_order_by_time() {
        let a = Tid::now();
        let b = Tid::now();
        assert_eq!(Value::from(a).cmp_same_type(&Value::from(b)), Ordering::Less);
        assert_eq!(Value::Text("a".into()).cmp_same_type(&Value::Text("b".into())), Ordering::Less);
        assert_eq!(Value::BigInt(-1).cmp_same_type(&Value::BigInt(1)), Ordering::Less);
    }
}
