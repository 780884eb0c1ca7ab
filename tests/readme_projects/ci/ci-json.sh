# A file that is not a report where the report would go, and a directory.
echo "not a report" > nobreak.json
mkdir out
