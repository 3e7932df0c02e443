-- New-user cohort study population (OHDSI CohortMethod conventions, DESIGN.md §3.2).
--
-- One row per cohort entry (target: treatment = 1, comparator: treatment = 0) that starts inside
-- an observation period of a person with a `person` row, keyed by (person_id, entry_seq):
-- entry_seq numbers a person's entries from 1 in (start_day, treatment, end_day) order. Days are
-- integers since 1970-01-01, both ends inclusive. `dropped_at` names the first step that removes
-- the entry (0 = kept):
--   2 first exposure only, 3 duplicate subjects (in both cohorts), 4 washout (prior observation),
--   6 prior outcome, 7 minimum days at risk.
-- Step 5 (the common period of the two cohorts) is the caller's: it is one range over all
-- persons' entries that pass steps 2–4, and no later step of this query depends on it.
-- Risk window: [risk_start, risk_end], censored at the observation end and, when asked for, the
-- day before the person's next risk window. Outcome and competing event: the first in the
-- window. Fine–Gray status: 1 outcome, 2 competing event (if strictly earlier), 0 censored;
-- time = event day − risk_start + 1, else the window length.
--
-- Every window and join is by person: the query has no global numbering, ordering or
-- aggregate, so a distributed engine runs it hash-partitioned by person_id, and the caller
-- numbers the entries (row_id) in (person_id, entry_seq) order.
--
-- Placeholders: {target}, {comparator}, {outcome} (person_id, concept_id, start_day, end_day),
-- {competing} (person_id, day), {first_only}, {duplicates} (keep_all | remove_all | keep_first),
-- {washout_days}, {remove_prior}, {prior_lookback}, {risk_start},
-- {risk_end} (expressions of start_day / end_day), {censor_new_window}, {min_days}.
--
-- `treatment` is spelled `floor(random()) + 1` / `+ 0` (always 1 / 0: random() is in [0, 1))
-- rather than a literal: DataFusion 55 pushes a window's sort on (…, treatment, …) below the
-- UNION ALL, each branch drops its constant `treatment` from the sort, and the plan's sanity
-- check then rejects the merge above the union (apache/datafusion #17372's family; seen on
-- stores large enough to repartition). A volatile expression is never a constant, so each
-- branch sorts on all its keys.
WITH entry AS (
  SELECT person_id, CAST(floor(random()) AS BIGINT) + 1 AS treatment, start_day, end_day
  FROM ({target}) AS t
  UNION ALL
  SELECT person_id, CAST(floor(random()) AS BIGINT) + 0 AS treatment, start_day, end_day
  FROM ({comparator}) AS c
),
outcome AS (
  {outcome}
),
competing AS (
  {competing}
),
observed AS (
  SELECT row_number() OVER (
           PARTITION BY e.person_id
           ORDER BY e.start_day, e.treatment, e.end_day, op.observation_period_start_date,
                    op.observation_period_end_date) AS entry_seq,
         e.person_id, e.treatment, e.start_day, greatest(e.end_day, e.start_day) AS end_day,
         CAST(op.observation_period_start_date AS INT) AS obs_start,
         CAST(op.observation_period_end_date AS INT) AS obs_end,
         CAST(make_date(CAST(p.year_of_birth AS INT), CAST(coalesce(p.month_of_birth, 1) AS INT),
                        CAST(coalesce(p.day_of_birth, 1) AS INT)) AS INT) AS birth_day,
         p.gender_concept_id
  FROM entry e
  JOIN person p ON p.person_id = e.person_id
  JOIN observation_period op
    ON op.person_id = e.person_id
   AND e.start_day BETWEEN CAST(op.observation_period_start_date AS INT)
                       AND CAST(op.observation_period_end_date AS INT)
),
first_pass AS (
  SELECT o.*,
         (NOT {first_only}) OR row_number() OVER (
           PARTITION BY person_id, treatment ORDER BY start_day, end_day, entry_seq) = 1 AS pass_first
  FROM observed o
),
cohort_starts AS (
  SELECT f.*,
         min(CASE WHEN pass_first AND treatment = 1 THEN start_day END)
           OVER (PARTITION BY person_id) AS target_start,
         min(CASE WHEN pass_first AND treatment = 0 THEN start_day END)
           OVER (PARTITION BY person_id) AS comparator_start
  FROM first_pass f
),
checked AS (
  SELECT c.*,
         CASE '{duplicates}'
           WHEN 'keep_all' THEN TRUE
           WHEN 'remove_all' THEN target_start IS NULL OR comparator_start IS NULL
           ELSE target_start IS NULL OR comparator_start IS NULL
                OR (treatment = 1 AND target_start < comparator_start)
                OR (treatment = 0 AND comparator_start < target_start)
         END AS pass_duplicates,
         start_day - obs_start >= {washout_days} AS pass_washout,
         {risk_start} AS risk_start,
         least({risk_end}, obs_end) AS risk_end_observed
  FROM cohort_starts c
),
next_window AS (
  SELECT person_id, entry_seq,
         lead(risk_start) OVER (PARTITION BY person_id ORDER BY start_day, entry_seq) AS next_risk_start
  FROM checked
  WHERE pass_first AND pass_duplicates AND pass_washout
),
windowed AS (
  SELECT c.*,
         CASE WHEN {censor_new_window} AND n.next_risk_start IS NOT NULL
              THEN least(c.risk_end_observed, n.next_risk_start - 1)
              ELSE c.risk_end_observed END AS risk_end
  FROM checked c
  LEFT JOIN next_window n ON n.person_id = c.person_id AND n.entry_seq = c.entry_seq
),
outcome_days AS (
  SELECT w.person_id, w.entry_seq,
         max(CASE WHEN o.start_day BETWEEN w.start_day - {prior_lookback} AND w.risk_start - 1
                  THEN 1 ELSE 0 END) AS prior_outcome,
         min(CASE WHEN o.start_day BETWEEN w.risk_start AND w.risk_end THEN o.start_day END) AS outcome_day
  FROM windowed w
  JOIN outcome o ON o.person_id = w.person_id
  GROUP BY w.person_id, w.entry_seq
),
competing_days AS (
  SELECT w.person_id, w.entry_seq, min(k.day) AS competing_day
  FROM windowed w
  JOIN competing k ON k.person_id = w.person_id AND k.day BETWEEN w.risk_start AND w.risk_end
  GROUP BY w.person_id, w.entry_seq
),
assessed AS (
  SELECT w.*, coalesce(o.prior_outcome, 0) AS prior_outcome, o.outcome_day, k.competing_day,
         CASE WHEN o.outcome_day IS NOT NULL
                   AND (k.competing_day IS NULL OR o.outcome_day <= k.competing_day) THEN 1
              WHEN k.competing_day IS NOT NULL THEN 2
              ELSE 0 END AS status
  FROM windowed w
  LEFT JOIN outcome_days o ON o.person_id = w.person_id AND o.entry_seq = w.entry_seq
  LEFT JOIN competing_days k ON k.person_id = w.person_id AND k.entry_seq = w.entry_seq
)
SELECT person_id, entry_seq, treatment, start_day, end_day, obs_start, obs_end,
       birth_day, gender_concept_id, risk_start, risk_end, prior_outcome, outcome_day,
       competing_day, status,
       CASE status WHEN 1 THEN outcome_day WHEN 2 THEN competing_day ELSE risk_end END
         - risk_start + 1 AS days_at_risk_or_event,
       CASE WHEN NOT pass_first THEN 2
            WHEN NOT pass_duplicates THEN 3
            WHEN NOT pass_washout THEN 4
            WHEN {remove_prior} AND prior_outcome = 1 THEN 6
            WHEN risk_end - risk_start + 1 < {min_days} THEN 7
            ELSE 0 END AS dropped_at
FROM assessed
