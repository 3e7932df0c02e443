-- Drug eras from exposures (OHDSI convention, for stores whose drug_era is empty, e.g. Synthea27Nj).
--
-- Input {exposures}: person_id, concept_id, start_day, end_day (days since 1970-01-01, inclusive).
-- Exposures of one person and concept are ordered by start; a new era starts when the exposure
-- starts more than {persistence_days} days after the latest end so far (persistence window:
-- with 30, a gap of ≥ 31 days starts a new era). Each era spans its exposures' first start to
-- their latest end. Output: person_id, concept_id, start_day, end_day, exposure_count.
WITH exposure AS (
  {exposures}
),
ordered AS (
  SELECT person_id, concept_id, start_day, greatest(end_day, start_day) AS end_day,
         max(greatest(end_day, start_day)) OVER (
           PARTITION BY person_id, concept_id ORDER BY start_day, end_day
           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS latest_end_before
  FROM exposure
),
numbered AS (
  SELECT person_id, concept_id, start_day, end_day,
         sum(CASE WHEN latest_end_before IS NULL
                    OR start_day > latest_end_before + {persistence_days} THEN 1 ELSE 0 END) OVER (
           PARTITION BY person_id, concept_id ORDER BY start_day, end_day
           ROWS UNBOUNDED PRECEDING) AS era_number
  FROM ordered
)
SELECT person_id, concept_id, min(start_day) AS start_day, max(end_day) AS end_day,
       count(*) AS exposure_count
FROM numbered
GROUP BY person_id, concept_id, era_number
