//! Text retention (SPEC.md "Tenant settings"): runs outside a tenant's sample keep no prompt or
//! answer text from the start (decided in the log writer, so no text reaches the database), and
//! a background cleanup strips text older than the tenant's retention from stored runs, in
//! bounded batches. Cost, model, status and timings always stay. Debug runs keep their text.

use foldhash::HashMap;
use std::time::{Duration, Instant};

use baton_domain::retention::{keeps_text, strip_event_text};
use baton_domain::run::{RawJson, RunRecord, StoredEvent};
use baton_domain::settings::TenantSettings;
use baton_domain::{TenantId, Timestamp};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::entity::{runs, tenants};
use crate::time::to_millis;
use crate::{Store, StoreResult};

/// How long the writer trusts a tenant's sample rate before reading it again (the API's
/// settings cache is as stale).
const RATE_TTL: Duration = Duration::from_secs(30);
const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// The log writer's view of the tenants' sample rates, and of which recent requests keep text
/// (a run's events may reach the writer in a later batch than its row). Looked up several
/// times per run, keyed by ids Baton generates: foldhash rather than SipHash.
#[derive(Default)]
pub(crate) struct TextSampling {
    rates: HashMap<String, (f64, Instant)>,
    recent: HashMap<String, bool>,
    older: HashMap<String, bool>,
}

/// Requests remembered per generation; two generations bound the memory.
const RECENT_LIMIT: usize = 10_000;

impl TextSampling {
    async fn rate(&mut self, store: &Store, tenant: &TenantId) -> f64 {
        if let Some((rate, read)) = self.rates.get(tenant.as_str())
            && read.elapsed() < RATE_TTL
        {
            return *rate;
        }
        let rate = match store.tenant_settings(tenant).await {
            Ok(found) => found.settings.text_sample_rate,
            // Unknown now: keep the text (the default) rather than lose it.
            Err(_) => 1.0,
        };
        self.rates
            .insert(tenant.as_str().to_string(), (rate, Instant::now()));
        rate
    }

    fn remember(&mut self, root_id: &str, keep: bool) {
        if self.recent.len() >= RECENT_LIMIT {
            self.older = std::mem::take(&mut self.recent);
        }
        self.recent.insert(root_id.to_string(), keep);
    }

    fn decided(&self, root_id: &str) -> Option<bool> {
        self.recent
            .get(root_id)
            .or_else(|| self.older.get(root_id))
            .copied()
    }

    /// Drops the text of runs outside their tenant's sample, and of their events.
    pub(crate) async fn apply(
        &mut self,
        store: &Store,
        records: &mut [RunRecord],
        events: &mut [(TenantId, StoredEvent)],
    ) {
        for record in records.iter_mut() {
            let Some(tenant) = record.tenant.clone() else {
                continue;
            };
            let keep = match self.decided(&record.root_id) {
                // A debug sub-agent of a sampled-out tree still keeps its own text.
                Some(keep) => keep || record.is_debug,
                None => {
                    let rate = self.rate(store, &tenant).await;
                    let keep = keeps_text(&record.root_id, rate, record.is_debug);
                    if record.id == record.root_id {
                        self.remember(&record.root_id, keep);
                    }
                    keep
                }
            };
            if !keep {
                record.request = None;
                record.response = None;
                record.detail_dropped = true;
            }
        }
        for (tenant, event) in events.iter_mut() {
            let keep = match self.decided(&event.run_id) {
                Some(keep) => keep,
                None => {
                    let rate = self.rate(store, tenant).await;
                    keeps_text(&event.run_id, rate, false)
                }
            };
            if !keep {
                let mut envelope = event.payload.to_value();
                strip_event_text(&mut envelope);
                event.payload = RawJson::of(&envelope);
            }
        }
    }
}

impl Store {
    /// Tenants whose settings limit how long text is kept: `(tenant, days)`.
    pub async fn tenants_with_text_retention(&self) -> StoreResult<Vec<(TenantId, u32)>> {
        let rows = tenants::Entity::find()
            .select_only()
            .column(tenants::Column::Id)
            .column(tenants::Column::Settings)
            .into_tuple::<(String, String)>()
            .all(self.conn())
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, settings)| {
                let settings: TenantSettings = serde_json::from_str(&settings).ok()?;
                Some((TenantId::new(id), settings.text_retention_days?))
            })
            .collect())
    }

    /// Strips the text of up to `batch` of the tenant's runs created before `now - days`
    /// (debug runs excepted) and of their stored events. Returns how many runs it stripped; call
    /// again while it returns `batch`.
    pub async fn strip_expired_text(
        &self,
        tenant: &TenantId,
        days: u32,
        batch: u64,
    ) -> StoreResult<u64> {
        let cutoff = to_millis(Timestamp::now()) - i64::from(days) * DAY_MS;
        let ids: Vec<String> = runs::Entity::find()
            .select_only()
            .column(runs::Column::Id)
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .filter(runs::Column::CreatedAt.lt(cutoff))
            .filter(runs::Column::IsDebug.eq(false))
            .filter(
                runs::Column::RequestText
                    .is_not_null()
                    .or(runs::Column::ResponseText.is_not_null()),
            )
            .order_by_asc(runs::Column::CreatedAt)
            .limit(batch)
            .into_tuple::<String>()
            .all(self.conn())
            .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let txn = self.begin_write().await?;
        runs::Entity::update_many()
            .col_expr(
                runs::Column::RequestText,
                Expr::value(Option::<String>::None),
            )
            .col_expr(
                runs::Column::ResponseText,
                Expr::value(Option::<String>::None),
            )
            .col_expr(runs::Column::DetailDropped, Expr::value(true))
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .filter(runs::Column::Id.is_in(ids.iter().map(String::as_str)))
            .exec(&txn)
            .await?;
        crate::event_pages::strip_text(&txn, tenant, &ids).await?;
        txn.commit().await?;
        Ok(ids.len() as u64)
    }

    /// One cleanup pass over every tenant with a retention period, a batch at a time.
    pub async fn strip_all_expired_text(&self, batch: u64) -> StoreResult<u64> {
        let mut stripped = 0;
        for (tenant, days) in self.tenants_with_text_retention().await? {
            loop {
                match self.strip_expired_text(&tenant, days, batch).await {
                    Ok(count) => {
                        stripped += count;
                        if count < batch {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(tenant = tenant.as_str(), %error, "text retention cleanup failed; retrying next pass");
                        break;
                    }
                }
                // Let request traffic in between batches.
                tokio::task::yield_now().await;
            }
        }
        Ok(stripped)
    }
}

/// Runs [`Store::strip_all_expired_text`] every `interval` until the process ends.
pub fn spawn_text_cleanup(store: Store, interval: Duration, batch: u64) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match store.strip_all_expired_text(batch).await {
                Ok(0) => {}
                Ok(count) => tracing::info!(runs = count, "text retention: stripped old text"),
                Err(error) => tracing::warn!(%error, "text retention cleanup failed"),
            }
        }
    });
}
