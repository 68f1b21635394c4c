-- os: no programs, environment or clock
local x = input("x", {4, 8})
os.execute("touch /tmp/kiln-sandbox-escaped") -- ERROR
minimize(x:sum())
