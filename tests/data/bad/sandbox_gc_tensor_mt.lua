-- the tensors' shared metatable is locked: a __gc set there would run after
-- the script, with Lua's hooks off, where no bound holds (an endless loop)
local mt = getmetatable(input("z", {2}, "f32")); mt.__gc = function() while true do end end -- ERROR
local x = input("x", {4, 8})
minimize(x:sum())
