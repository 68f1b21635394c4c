-- a __gc finalizer would run after the script, while kiln reads its graph
local x = input("x", {4, 8})
local t = setmetatable({}, {__gc = function() input("late", {2}) end}) -- ERROR
minimize(x:sum())
