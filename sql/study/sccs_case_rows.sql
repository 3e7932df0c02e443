-- Rows of one concept set (outcome or exposure) for the kept SCCS cases.
--
-- {cases}: the kept cases (case_index, person_id, obs_start, obs_end, start_day, end_day);
-- {rows}: person_id, concept_id, start_day, end_day; {condition}: which rows a case needs
-- (outcomes: inside the case window; exposures: every era of the person).
SELECT c.case_index, r.concept_id, r.start_day, r.end_day
FROM {cases} c
JOIN ({rows}) AS r ON r.person_id = c.person_id
WHERE {condition}
