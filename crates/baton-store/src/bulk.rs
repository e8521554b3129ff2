//! Multi-row `INSERT`s for the invocation log's hot tables (runs, their tags and events), with
//! the SQL text rendered once per table, backend and row count.
//!
//! sea-query's `insert_many` renders a 128-row statement placeholder by placeholder on every
//! call and clones every value on the way (about a sixth of a logged request's instructions on
//! SQLite, docs/performance.md). Here the columns come from the entity (so the statement follows
//! the schema), values are moved into the statement, and the text is reused; the connection's
//! prepared-statement cache then finds the statement by the same text.

use std::sync::OnceLock;

use sea_orm::{ConnectionTrait, DbBackend, EntityTrait, IdenStatic, Iterable, Statement, Value};

use crate::StoreResult;

/// Most rows per `INSERT` statement (statements hold 128, 64, ..., 2 or 1 rows), so no batch,
/// however long its tool loops, reaches a bound on bound parameters: the widest table (`runs`,
/// 43 columns) binds 5,504 at most, against SQLite's 32,766 and PostgreSQL's 65,535.
pub const ROWS_PER_STATEMENT: usize = 128;
/// One rendered text per power of two up to [`ROWS_PER_STATEMENT`].
const SHAPES: usize = ROWS_PER_STATEMENT.ilog2() as usize + 1;

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

/// What a row whose key is already stored does.
pub(crate) enum OnConflict {
    /// Keeps the stored row.
    Ignore,
    /// Keeps the stored row when `key` matches.
    IgnoreKey(&'static [&'static str]),
    /// Replaces `columns` of the stored row whose `key` matches.
    Update {
        key: &'static str,
        columns: Vec<&'static str>,
    },
}

/// An `INSERT` into one table, every column, of any number of rows.
pub(crate) struct BulkInsert {
    table: &'static str,
    columns: Vec<&'static str>,
    on_conflict: OnConflict,
    /// Rendered texts: `[postgres?][log2(rows)]`.
    rendered: [[OnceLock<String>; SHAPES]; 2],
}

impl BulkInsert {
    /// Every column of entity `E`, in the entity's declaration order (the order callers'
    /// values must follow: iterate `E::Column::iter()` to produce them).
    pub(crate) fn of<E: EntityTrait + Default>(on_conflict: OnConflict) -> Self {
        BulkInsert {
            table: E::default().table_name(),
            columns: E::Column::iter().map(|c| c.as_str()).collect(),
            on_conflict,
            rendered: Default::default(),
        }
    }

    pub(crate) fn width(&self) -> usize {
        self.columns.len()
    }

    /// Inserts `values` (`rows` rows of [`Self::width`] values each, row after row) in
    /// statements of [`row_counts`] rows.
    pub(crate) async fn insert<C: ConnectionTrait>(
        &self,
        conn: &C,
        values: Vec<Value>,
    ) -> StoreResult<()> {
        let width = self.width();
        debug_assert_eq!(values.len() % width, 0, "{}: partial row", self.table);
        let mut values = values.into_iter();
        let backend = conn.get_database_backend();
        for rows in row_counts(values.len() / width) {
            let sql = self.sql(backend, rows);
            let statement =
                Statement::from_sql_and_values(backend, sql, values.by_ref().take(rows * width));
            conn.execute_raw(statement).await?;
        }
        Ok(())
    }

    fn sql(&self, backend: DbBackend, rows: usize) -> &str {
        let postgres = usize::from(backend == DbBackend::Postgres);
        self.rendered[postgres][rows.ilog2() as usize].get_or_init(|| self.render(backend, rows))
    }

    fn render(&self, backend: DbBackend, rows: usize) -> String {
        use std::fmt::Write as _;
        let quoted = |names: &[&str]| {
            names
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
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
        match &self.on_conflict {
            OnConflict::Ignore => sql.push_str(" ON CONFLICT DO NOTHING"),
            OnConflict::IgnoreKey(key) => {
                let _ = write!(sql, " ON CONFLICT ({}) DO NOTHING", quoted(key));
            }
            OnConflict::Update { key, columns } => {
                let _ = write!(sql, " ON CONFLICT (\"{key}\") DO UPDATE SET ");
                let set: Vec<String> = columns
                    .iter()
                    .map(|c| format!("\"{c}\" = \"excluded\".\"{c}\""))
                    .collect();
                sql.push_str(&set.join(", "));
            }
        }
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::run_tags;

    #[test]
    fn rows_go_in_powers_of_two_up_to_the_bound() {
        assert_eq!(row_counts(0).count(), 0);
        assert_eq!(row_counts(1).collect::<Vec<_>>(), [1]);
        assert_eq!(row_counts(7).collect::<Vec<_>>(), [4, 2, 1]);
        assert_eq!(row_counts(300).collect::<Vec<_>>(), [128, 128, 32, 8, 4]);
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
            columns: vec!["tag", "created_at"],
        });
        assert!(update.sql(DbBackend::Sqlite, 1).ends_with(
            "ON CONFLICT (\"run_id\") DO UPDATE SET \"tag\" = \"excluded\".\"tag\", \
             \"created_at\" = \"excluded\".\"created_at\""
        ));
    }
}
