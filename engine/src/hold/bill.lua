-- Adds tokens billed outside a turn's reservation (a background summary) to the day's
-- and the month's counters that exist: the team's, and its end user's when given.
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[1]) end
end
return 1
