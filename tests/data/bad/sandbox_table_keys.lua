-- a table of string keys without end: the default memory bound stops it in
-- seconds (it ran past 60 s under a 1 GiB bound and a 300 s clock)
local x = input("x", {4, 8})
local t = {}
for i = 1, 1e9 do t["k" .. i] = i end -- ERROR
minimize(x:sum())
