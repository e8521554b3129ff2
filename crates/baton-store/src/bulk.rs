//! Multi-row `INSERT`s for the invocation log's hot tables (runs, their tags and events), with
//! the SQL text rendered once per table, backend and row count.
//!
//! sea-query's `insert_many` renders a 128-row statement placeholder by placeholder on every
//! call and clones every value on the way (about a sixth of a logged request's instructions on
//! SQLite, docs/performance.md). Here the columns come from the entity (so the statement follows
//! the schema), values are moved into the statement, and the text is reused; the connection's
//! prepared-statement cache then finds the statement by the same text.
//!
//! On PostgreSQL the rows go as one array per column (`INSERT ... SELECT UNNEST($1), ...`): a
//! `VALUES` list of 128 rows binds 5,504 parameters that the server receives, and whose
//! expressions it builds, one by one on every execution, where the arrays are a few dozen
//! parameters whatever the row count, one statement per table for a whole batch
//! (docs/performance.md, "The database's share on PostgreSQL").

use std::sync::OnceLock;

use sea_orm::sea_query::ArrayType;
use sea_orm::{
    ColumnTrait, ColumnType, ConnectionTrait, DbBackend, EntityTrait, IdenStatic, Iterable,
    Statement, Value,
};

use crate::{StoreError, StoreResult};

/// Most rows per `INSERT` statement (statements hold 128, 64, ..., 2 or 1 rows), so no batch,
/// however long its tool loops, reaches a bound on bound parameters: the widest table (`runs`,
/// 43 columns) binds 5,504 at most, against SQLite's 32,766 and PostgreSQL's 65,535.
pub const ROWS_PER_STATEMENT: usize = 128;
/// One rendered text per power of two up to [`ROWS_PER_STATEMENT`].
const SHAPES: usize = ROWS_PER_STATEMENT.ilog2() as usize + 1;
/// Most rows per PostgreSQL array statement: bounds one message (~2 KB a logged run) while a
/// default batch (256 runs) still goes in one statement per table. A store may ask for fewer
/// ([`crate::Store::with_array_statement_rows`]).
pub const ARRAY_ROWS_PER_STATEMENT: usize = 1024;
/// Nullable columns a table may have for the array form: their NULL flags share one `BIGINT`
/// per row.
const MAX_NULLABLE: usize = 63;

/// The PostgreSQL array a column's values travel in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArrayOf {
    Text,
    Int4,
    Int8,
    Bool,
    Bytea,
}

impl ArrayOf {
    fn of(column_type: &ColumnType) -> Option<ArrayOf> {
        match column_type {
            ColumnType::String(_) | ColumnType::Text | ColumnType::Char(_) => Some(ArrayOf::Text),
            ColumnType::Integer => Some(ArrayOf::Int4),
            ColumnType::BigInteger => Some(ArrayOf::Int8),
            ColumnType::Boolean => Some(ArrayOf::Bool),
            ColumnType::Blob | ColumnType::Binary(_) | ColumnType::VarBinary(_) => {
                Some(ArrayOf::Bytea)
            }
            _ => None,
        }
    }

    fn cast(self) -> &'static str {
        match self {
            ArrayOf::Text => "text[]",
            ArrayOf::Int4 => "int4[]",
            ArrayOf::Int8 => "int8[]",
            ArrayOf::Bool => "bool[]",
            ArrayOf::Bytea => "bytea[]",
        }
    }

    fn array_type(self) -> ArrayType {
        match self {
            ArrayOf::Text => ArrayType::String,
            ArrayOf::Int4 => ArrayType::Int,
            ArrayOf::Int8 => ArrayType::BigInt,
            ArrayOf::Bool => ArrayType::Bool,
            ArrayOf::Bytea => ArrayType::Bytes,
        }
    }

    /// `value` as an element of this array: `Ok(None)` for a NULL, `Err` for a value of
    /// another type (an array element must be of the array's type, or the driver panics).
    fn element(self, value: Value) -> Result<Option<Value>, Value> {
        let is_null = match (self, &value) {
            (ArrayOf::Text, Value::String(v)) => v.is_none(),
            (ArrayOf::Int4, Value::Int(v)) => v.is_none(),
            (ArrayOf::Int8, Value::BigInt(v)) => v.is_none(),
            (ArrayOf::Bool, Value::Bool(v)) => v.is_none(),
            (ArrayOf::Bytea, Value::Bytes(v)) => v.is_none(),
            _ => return Err(value),
        };
        Ok((!is_null).then_some(value))
    }

    /// What a NULL is sent as (arrays of the driver carry no NULL); its flag makes it NULL.
    fn stand_in(self) -> Value {
        match self {
            ArrayOf::Text => Value::String(Some(String::new())),
            ArrayOf::Int4 => Value::Int(Some(0)),
            ArrayOf::Int8 => Value::BigInt(Some(0)),
            ArrayOf::Bool => Value::Bool(Some(false)),
            ArrayOf::Bytea => Value::Bytes(Some(Vec::new())),
        }
    }
}

/// A column in the array form: its array, and its bit in the row's NULL flags if nullable.
#[derive(Clone, Copy, Debug)]
struct ArrayColumn {
    array: ArrayOf,
    null_bit: Option<u32>,
}

/// The row counts `total` rows are written in: the largest power of two that fits, each time
/// (few distinct statements, each prepared once per connection and then reused).
pub(crate) fn row_counts(total: usize) -> impl Iterator<Item = usize> {
    let mut left = total;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let size = 1usize << left.min(ROWS_PER_STATEMENT).ilog2();
        left -= size;
        Some(size)
    })
}

/// `rows` in vectors of [`row_counts`] rows (for tables written through sea-orm's own
/// `insert_many`).
pub(crate) fn chunks<T>(rows: Vec<T>) -> impl Iterator<Item = Vec<T>> {
    let mut rows = rows.into_iter();
    row_counts(rows.len()).map(move |size| rows.by_ref().take(size).collect())
}

/// `"a", "b", "c"`: identifiers quoted as both databases take them.
fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a row whose key is already stored does.
pub(crate) enum OnConflict {
    /// Keeps the stored row.
    Ignore,
    /// Keeps the stored row when `key` matches.
    IgnoreKey(&'static [&'static str]),
    /// Replaces `columns` of the stored row whose `key` matches, and sets each of `kept` only
    /// where the stored row has none (a retried write keeps what is stored, as `Ignore` does).
    Update {
        key: &'static str,
        columns: Vec<&'static str>,
        kept: Vec<&'static str>,
    },
}

/// An `INSERT` into one table, every column, of any number of rows.
pub(crate) struct BulkInsert {
    table: &'static str,
    columns: Vec<&'static str>,
    on_conflict: OnConflict,
    /// Rendered texts: `[postgres?][log2(rows)]`. PostgreSQL's serve only a table with a
    /// column that has no array form (or over [`MAX_NULLABLE`] nullable ones); the three log
    /// tables have none, so theirs stay unrendered.
    rendered: [[OnceLock<String>; SHAPES]; 2],
    /// The columns in PostgreSQL's array form, when every column has one.
    arrays: Option<Vec<ArrayColumn>>,
    /// The array form's text (any row count).
    rendered_arrays: OnceLock<String>,
}

impl BulkInsert {
    /// Every column of entity `E`, in the entity's declaration order (the order callers'
    /// values must follow: iterate `E::Column::iter()` to produce them).
    pub(crate) fn of<E: EntityTrait + Default>(on_conflict: OnConflict) -> Self {
        let mut nullable = 0u32;
        let arrays: Option<Vec<ArrayColumn>> = E::Column::iter()
            .map(|column| {
                let def = column.def();
                let null_bit = def.is_null().then(|| {
                    nullable += 1;
                    nullable - 1
                });
                ArrayOf::of(def.get_column_type()).map(|array| ArrayColumn { array, null_bit })
            })
            .collect();
        BulkInsert {
            table: E::default().table_name(),
            columns: E::Column::iter().map(|c| c.as_str()).collect(),
            on_conflict,
            rendered: Default::default(),
            arrays: arrays.filter(|_| nullable as usize <= MAX_NULLABLE),
            rendered_arrays: OnceLock::new(),
        }
    }

    pub(crate) fn width(&self) -> usize {
        self.columns.len()
    }

    /// Inserts `values` (`rows` rows of [`Self::width`] values each, row after row) in
    /// statements of [`row_counts`] rows, or on PostgreSQL as arrays of at most `array_rows`
    /// rows a statement.
    pub(crate) async fn insert<C: ConnectionTrait>(
        &self,
        conn: &C,
        values: Vec<Value>,
        array_rows: usize,
    ) -> StoreResult<()> {
        let width = self.width();
        debug_assert_eq!(values.len() % width, 0, "{}: partial row", self.table);
        let backend = conn.get_database_backend();
        if backend == DbBackend::Postgres
            && let Some(arrays) = &self.arrays
        {
            return self.insert_arrays(conn, arrays, values, array_rows).await;
        }
        let mut values = values.into_iter();
        for rows in row_counts(values.len() / width) {
            let sql = self.sql(backend, rows);
            let statement =
                Statement::from_sql_and_values(backend, sql, values.by_ref().take(rows * width));
            conn.execute_raw(statement).await?;
        }
        Ok(())
    }

    /// PostgreSQL: the rows as one array per column, and the NULL flags of each row as one
    /// more (`render_arrays`).
    async fn insert_arrays<C: ConnectionTrait>(
        &self,
        conn: &C,
        arrays: &[ArrayColumn],
        values: Vec<Value>,
        array_rows: usize,
    ) -> StoreResult<()> {
        let width = self.width();
        let flagged = arrays.iter().any(|c| c.null_bit.is_some());
        let mut values = values.into_iter();
        while values.len() > 0 {
            let rows = (values.len() / width).clamp(1, array_rows.max(1));
            let mut columns: Vec<Vec<Value>> =
                arrays.iter().map(|_| Vec::with_capacity(rows)).collect();
            let mut flags: Vec<Value> = Vec::with_capacity(if flagged { rows } else { 0 });
            for _ in 0..rows {
                let mut row_flags = 0i64;
                for ((spec, column), name) in arrays.iter().zip(&mut columns).zip(&self.columns) {
                    let value = values.next().ok_or_else(|| self.corrupt("a partial row"))?;
                    match (spec.array.element(value), spec.null_bit) {
                        (Ok(Some(element)), _) => column.push(element),
                        (Ok(None), Some(bit)) => {
                            column.push(spec.array.stand_in());
                            row_flags |= 1 << bit;
                        }
                        (Ok(None), None) => {
                            return Err(self.corrupt(&format!("NULL in the non-null {name}")));
                        }
                        (Err(value), _) => {
                            return Err(self.corrupt(&format!(
                                "{name} given {value:?} for an array of {}",
                                spec.array.cast()
                            )));
                        }
                    }
                }
                if flagged {
                    flags.push(Value::BigInt(Some(row_flags)));
                }
            }
            let mut parameters: Vec<Value> = columns
                .into_iter()
                .zip(arrays)
                .map(|(column, spec)| Value::Array(spec.array.array_type(), Some(Box::new(column))))
                .collect();
            if flagged {
                parameters.push(Value::Array(ArrayType::BigInt, Some(Box::new(flags))));
            }
            let sql = self
                .rendered_arrays
                .get_or_init(|| self.render_arrays(arrays));
            let statement =
                Statement::from_sql_and_values(DbBackend::Postgres, sql.as_str(), parameters);
            conn.execute_raw(statement).await?;
        }
        Ok(())
    }

    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::Corrupt("bulk insert", format!("{}: {what}", self.table))
    }

    fn sql(&self, backend: DbBackend, rows: usize) -> &str {
        let postgres = usize::from(backend == DbBackend::Postgres);
        self.rendered[postgres][rows.ilog2() as usize].get_or_init(|| self.render(backend, rows))
    }

    fn render(&self, backend: DbBackend, rows: usize) -> String {
        use std::fmt::Write as _;
        let mut sql = format!(
            "INSERT INTO \"{}\" ({}) VALUES ",
            self.table,
            quoted(&self.columns)
        );
        let mut parameter = 0usize;
        for row in 0..rows {
            sql.push_str(if row == 0 { "(" } else { ", (" });
            for column in 0..self.columns.len() {
                parameter += 1;
                if column > 0 {
                    sql.push_str(", ");
                }
                match backend {
                    DbBackend::Postgres => {
                        let _ = write!(sql, "${parameter}");
                    }
                    _ => sql.push('?'),
                }
            }
            sql.push(')');
        }
        self.push_conflict_clause(&mut sql);
        sql
    }

    /// `INSERT INTO t (a, b, c) SELECT a, CASE WHEN "_nulls" & 1 = 0 THEN b END, c FROM
    /// (SELECT UNNEST($1::text[]) AS a, UNNEST($2::text[]) AS b, ..., UNNEST($4::int8[]) AS
    /// "_nulls") AS "_rows"`: a nullable column is NULL where its bit of the row's flags is
    /// set. The `UNNEST`s in the select list step through the arrays together, row by row;
    /// `FROM UNNEST(a, b, ...)` would copy every row into a tuplestore first (~15% more of the
    /// server's time for the statement).
    fn render_arrays(&self, arrays: &[ArrayColumn]) -> String {
        use std::fmt::Write as _;
        let mut names: Vec<String> = self.columns.iter().map(|n| format!("\"{n}\"")).collect();
        let selected: Vec<String> = names
            .iter()
            .zip(arrays)
            .map(|(name, spec)| match spec.null_bit {
                Some(bit) => format!("CASE WHEN \"_nulls\" & {} = 0 THEN {name} END", 1i64 << bit),
                None => name.clone(),
            })
            .collect();
        let mut casts: Vec<&str> = arrays.iter().map(|spec| spec.array.cast()).collect();
        if arrays.iter().any(|spec| spec.null_bit.is_some()) {
            casts.push(ArrayOf::Int8.cast());
            names.push("\"_nulls\"".to_string());
        }
        let mut sql = format!(
            "INSERT INTO \"{}\" ({}) SELECT {} FROM (SELECT ",
            self.table,
            names[..self.columns.len()].join(", "),
            selected.join(", "),
        );
        for (index, (cast, name)) in casts.iter().zip(&names).enumerate() {
            let separator = if index > 0 { ", " } else { "" };
            let _ = write!(sql, "{separator}UNNEST(${}::{cast}) AS {name}", index + 1);
        }
        sql.push_str(") AS \"_rows\"");
        self.push_conflict_clause(&mut sql);
        sql
    }

    fn push_conflict_clause(&self, sql: &mut String) {
        use std::fmt::Write as _;
        match &self.on_conflict {
            OnConflict::Ignore => sql.push_str(" ON CONFLICT DO NOTHING"),
            OnConflict::IgnoreKey(key) => {
                let _ = write!(sql, " ON CONFLICT ({}) DO NOTHING", quoted(key));
            }
            OnConflict::Update { key, columns, kept } => {
                let _ = write!(sql, " ON CONFLICT (\"{key}\") DO UPDATE SET ");
                let table = self.table;
                let set: Vec<String> = columns
                    .iter()
                    .map(|c| format!("\"{c}\" = \"excluded\".\"{c}\""))
                    .chain(kept.iter().map(|c| {
                        format!("\"{c}\" = COALESCE(\"{table}\".\"{c}\", \"excluded\".\"{c}\")")
                    }))
                    .collect();
                sql.push_str(&set.join(", "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::{run_event_pages, run_tags, runs};

    #[test]
    fn rows_go_in_powers_of_two_up_to_the_bound() {
        assert_eq!(row_counts(0).count(), 0);
        assert_eq!(row_counts(1).collect::<Vec<_>>(), [1]);
        assert_eq!(row_counts(7).collect::<Vec<_>>(), [4, 2, 1]);
        assert_eq!(row_counts(300).collect::<Vec<_>>(), [128, 128, 32, 8, 4]);
    }

    #[test]
    fn postgres_gets_one_array_per_column_and_null_flags_for_nullable_ones() {
        let tags = BulkInsert::of::<run_tags::Entity>(OnConflict::IgnoreKey(&["run_id", "tag"]));
        let arrays = tags.arrays.as_deref().unwrap();
        assert_eq!(
            tags.render_arrays(arrays),
            "INSERT INTO \"run_tags\" (\"run_id\", \"tag\", \"tenant_id\", \"created_at\") \
             SELECT \"run_id\", \"tag\", \"tenant_id\", \"created_at\" \
             FROM (SELECT UNNEST($1::text[]) AS \"run_id\", UNNEST($2::text[]) AS \"tag\", \
             UNNEST($3::text[]) AS \"tenant_id\", UNNEST($4::int8[]) AS \"created_at\") \
             AS \"_rows\" ON CONFLICT (\"run_id\", \"tag\") DO NOTHING"
        );
        let pages = BulkInsert::of::<run_event_pages::Entity>(OnConflict::Ignore);
        let arrays = pages.arrays.as_deref().unwrap();
        assert_eq!(
            pages.render_arrays(arrays),
            "INSERT INTO \"run_event_pages\" \
             (\"tenant_id\", \"run_id\", \"first_seq\", \"events\", \"created_at\", \"packed\") \
             SELECT \"tenant_id\", \"run_id\", \"first_seq\", \"events\", \"created_at\", \
             CASE WHEN \"_nulls\" & 1 = 0 THEN \"packed\" END \
             FROM (SELECT UNNEST($1::text[]) AS \"tenant_id\", UNNEST($2::text[]) AS \"run_id\", \
             UNNEST($3::int4[]) AS \"first_seq\", UNNEST($4::text[]) AS \"events\", \
             UNNEST($5::int8[]) AS \"created_at\", UNNEST($6::bytea[]) AS \"packed\", \
             UNNEST($7::int8[]) AS \"_nulls\") AS \"_rows\" ON CONFLICT DO NOTHING"
        );
        // Every column of a run has an array form, its 19 nullable ones a flag each.
        let runs = BulkInsert::of::<runs::Entity>(OnConflict::Ignore);
        let columns = runs.arrays.as_deref().unwrap();
        assert_eq!(columns.iter().filter(|c| c.null_bit.is_some()).count(), 19);
    }

    #[test]
    fn a_value_of_another_type_or_a_null_where_none_may_be_is_an_error_not_a_panic() {
        assert_eq!(ArrayOf::Text.element(Value::String(None)), Ok(None));
        assert_eq!(
            ArrayOf::Int8.element(Value::BigInt(Some(3))),
            Ok(Some(Value::BigInt(Some(3))))
        );
        assert_eq!(
            ArrayOf::Int8.element(Value::Int(Some(3))),
            Err(Value::Int(Some(3)))
        );
    }

    #[test]
    fn renders_placeholders_per_backend_and_the_conflict_clause() {
        let tags = BulkInsert::of::<run_tags::Entity>(OnConflict::IgnoreKey(&["run_id", "tag"]));
        assert_eq!(
            tags.sql(DbBackend::Sqlite, 2),
            "INSERT INTO \"run_tags\" (\"run_id\", \"tag\", \"tenant_id\", \"created_at\") \
             VALUES (?, ?, ?, ?), (?, ?, ?, ?) ON CONFLICT (\"run_id\", \"tag\") DO NOTHING"
        );
        assert_eq!(
            tags.sql(DbBackend::Postgres, 2),
            "INSERT INTO \"run_tags\" (\"run_id\", \"tag\", \"tenant_id\", \"created_at\") \
             VALUES ($1, $2, $3, $4), ($5, $6, $7, $8) ON CONFLICT (\"run_id\", \"tag\") DO NOTHING"
        );
        let update = BulkInsert::of::<run_tags::Entity>(OnConflict::Update {
            key: "run_id",
            columns: vec!["tag"],
            kept: vec!["created_at"],
        });
        assert!(update.sql(DbBackend::Sqlite, 1).ends_with(
            "ON CONFLICT (\"run_id\") DO UPDATE SET \"tag\" = \"excluded\".\"tag\", \
             \"created_at\" = COALESCE(\"run_tags\".\"created_at\", \"excluded\".\"created_at\")"
        ));
    }
}
